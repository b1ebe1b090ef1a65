"""Ragged decode attention over the graph engine's slot cache (Triton, CUDA only).

Why: a captured decode step attends over one KV length bucket for every row, the bucket of
the longest context in the batch. With requests of mixed lengths (a sentence beside a
paragraph) most rows read columns they then mask out, and at 256 rows the KV read is most of
a step (60 KiB per cached position: 256 rows x 1,280 columns is ~19 GB, ~4.5 ms at the
H200's bandwidth). This kernel reads each row's own ``length`` columns only.

Split-K (FlashDecoding): programs ``(row, head, split)`` each reduce a chunk of the row's
columns to a running max, a sum of exponentials and a weighted sum of values in float32; a
second kernel merges the splits. Splits past a row's length do no loads. Shapes are static
per (batch, length bucket), so both kernels are captured in the step's CUDA graph.

Triton is imported when the first step is built; without it (or on CPU) the graph engine keeps
``scaled_dot_product_attention`` over the bucket, which is also what this kernel is tested against.
"""
from __future__ import annotations

import functools
import math

import torch

# Columns per inner iteration, warps and pipeline stages per program: the fastest of the configurations
# timed on the H200 at 128 and 256 rows (bench/results/attention-sweep-h200-2026-12-01.md).
BLOCK_N, WARPS, STAGES = 64, 2, 2
# Below this many rows the masked SDPA over the bucket is as fast or faster (same sweep): "auto" keeps it there.
MIN_RAGGED_BATCH = 128
# Programs the split count aims for: a few per SM of an H200 (132 SMs), so batch 1 still fills the GPU.
TARGET_PROGRAMS = 528


def available() -> bool:
    """Whether Triton can be imported here (the GPU image has it; the CPU test venv need not)."""
    try:
        import triton  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


@functools.cache
def _kernels():
    import triton  # noqa: PLC0415  (heavy, CUDA only)
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def partial_kernel(q_ptr, k_ptr, v_ptr, lengths_ptr, slots_ptr, acc_ptr, stats_ptr,
                       stride_qb, stride_qh, stride_kb, stride_kh, stride_kn,
                       scale, groups, splits, chunk,
                       HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, GATHERED: tl.constexpr):
        row = tl.program_id(0)
        slot_of_row = row
        if GATHERED:  # a gathered step's rows are any slots of the cache; otherwise row b is slot b
            slot_of_row = tl.load(slots_ptr + row)
        head = tl.program_id(1)
        split = tl.program_id(2)
        length = tl.load(lengths_ptr + row)
        start = split * chunk
        end = tl.minimum(start + chunk, length)
        kv_head = head // groups
        d = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + row * stride_qb + head * stride_qh + d).to(tl.float32) * scale
        k_base = k_ptr + slot_of_row * stride_kb + kv_head * stride_kh
        v_base = v_ptr + slot_of_row * stride_kb + kv_head * stride_kh
        m = tl.full((), float("-inf"), tl.float32)
        total = tl.zeros((), tl.float32)
        acc = tl.zeros((HEAD_DIM,), tl.float32)
        for first in range(start, end, BLOCK):
            n = first + tl.arange(0, BLOCK)
            valid = n < end
            offsets = n[:, None] * stride_kn + d[None, :]
            k = tl.load(k_base + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
            s = tl.where(valid, tl.sum(k * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new)
            v = tl.load(v_base + offsets, mask=valid[:, None], other=0.0).to(tl.float32)
            total = total * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        slot = (row * tl.num_programs(1) + head) * splits + split
        tl.store(acc_ptr + slot * HEAD_DIM + d, acc)
        tl.store(stats_ptr + slot * 2, m)
        tl.store(stats_ptr + slot * 2 + 1, total)

    @triton.jit
    def merge_kernel(acc_ptr, stats_ptr, out_ptr, stride_ob, stride_oh, splits,
                     HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):
        row = tl.program_id(0)
        head = tl.program_id(1)
        base = (row * tl.num_programs(1) + head) * splits
        i = tl.arange(0, SPLITS)
        here = i < splits
        m = tl.load(stats_ptr + (base + i) * 2, mask=here, other=float("-inf"))
        total = tl.load(stats_ptr + (base + i) * 2 + 1, mask=here, other=0.0)
        top = tl.max(m, axis=0)  # split 0 always holds column 0, so this is finite
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))
        d = tl.arange(0, HEAD_DIM)
        acc = tl.load(acc_ptr + (base + i)[:, None] * HEAD_DIM + d[None, :], mask=here[:, None], other=0.0)
        out = tl.sum(w[:, None] * acc, axis=0) / tl.sum(w * total, axis=0)
        tl.store(out_ptr + row * stride_ob + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))

    return triton, partial_kernel, merge_kernel


def split_count(batch: int, heads: int, length: int, block: int = BLOCK_N) -> int:
    """Splits per (row, head) for a static (batch, length bucket): enough programs to fill the GPU,
    and no split shorter than one block."""
    want = max(1, math.ceil(TARGET_PROGRAMS / (batch * heads)))
    return max(1, min(want, length // block))


def ragged_decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor,
                            length: int, *, slots: torch.Tensor | None = None, block: int = BLOCK_N,
                            warps: int = WARPS, stages: int = STAGES) -> torch.Tensor:
    """Attention of one new query per row over that row's first ``lengths[row]`` cached columns.

    ``q [B, H, 1, D]``; ``keys``/``values`` ``[B, KVH, >= length, D]`` (slot-cache rows, last dim
    contiguous); ``lengths [B]`` long, each in ``[1, length]``; ``length``: the static column bound
    (the step's bucket). With ``slots [B]`` (long) row ``b`` reads cache row ``slots[b]`` of
    ``keys``/``values`` (``[S, KVH, >= length, D]``, any number of slots): a gathered step, whose rows
    are wherever their slots sit, without copying their columns. Returns ``[B, H, 1, D]`` in ``q``'s
    dtype, as ``scaled_dot_product_attention`` with a mask of each row's first ``lengths`` columns would.
    """
    triton, partial_kernel, merge_kernel = _kernels()
    b, h, _, d = q.shape
    kv_heads = keys.shape[1]
    if keys.stride(-1) != 1 or values.stride() != keys.stride() or d & (d - 1):
        raise ValueError("ragged_decode_attention needs contiguous head dims, equal K/V strides and a "
                         "power-of-two head size")
    splits = split_count(b, h, length, block)
    chunk = math.ceil(math.ceil(length / splits) / block) * block
    acc = torch.empty(b, h, splits, d, dtype=torch.float32, device=q.device)
    stats = torch.empty(b, h, splits, 2, dtype=torch.float32, device=q.device)
    out = torch.empty(b, h, 1, d, dtype=q.dtype, device=q.device)
    partial_kernel[(b, h, splits)](
        q, keys, values, lengths, lengths if slots is None else slots, acc, stats,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        1.0 / math.sqrt(d), h // kv_heads, splits, chunk,
        HEAD_DIM=d, BLOCK=block, GATHERED=slots is not None, num_warps=warps, num_stages=stages)
    merge_kernel[(b, h)](acc, stats, out, out.stride(0), out.stride(1), splits,
                         HEAD_DIM=d, SPLITS=triton.next_power_of_2(splits), num_warps=1)
    return out
