"""The graph engine's decode trunk in fewer launches: fused Triton kernels around the projections.

Why: a captured decode step replays ~950 kernels, ~44 in each of the 20 layers, and most of them are
tiny pointwise ops: the RMSNorms (7 each), the rotary embedding (~12), the residual adds, the KV
writes, SiLU and its product. On an H200 a static step is bound by how many kernels it runs, not by
arithmetic or bandwidth: the anchor's captured step at 64 rows takes 2.8 ms while its projections and
attention alone take 0.8 ms (shared/anchors/README.md, "Op-level floor"). Here a layer is 9 launches:

  add + RMSNorm -> QKV projection (one GEMM) -> rotary + KV write -> attention -> O projection
  -> add + RMSNorm -> gate/up projection (one GEMM) -> SiLU x up -> down projection

Each kernel rounds where the torch modules round (to the activations' dtype after every op that returns
it), computing in float32 in between, so it returns the modules' values to the last bit except where a
reduction's order differs (an RMSNorm's mean of squares). The fused projections read one concatenated
weight per layer; the modules' own weights become views into it (no second copy; the prefill and the
reference engine keep using the modules).

Triton is imported when the first kernel is built, as ``engines.attention``'s. On CPU the kernels run
under Triton's interpreter (``TRITON_INTERPRET=1``): that is how the tests check them against the modules.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def interpreted() -> bool:
    """Triton kernels run on the CPU here (the interpreter: tests only, far too slow to serve)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _kernels():
    import triton  # noqa: PLC0415  (heavy, CUDA or the interpreter)
    import triton.language as tl  # noqa: PLC0415

    @triton.jit
    def add_rms_norm_kernel(x_ptr, delta_ptr, weight_ptr, out_ptr, sum_ptr, width, eps,
                            HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < width
        x = tl.load(x_ptr + row * width + cols, mask=mask, other=0.0)
        if HAS_DELTA:  # the residual stream plus a layer's output, rounded as `h + o` rounds
            delta = tl.load(delta_ptr + row * width + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + delta.to(tl.float32)).to(x.dtype)
            tl.store(sum_ptr + row * width + cols, x, mask=mask)
        xf = x.to(tl.float32)
        variance = tl.sum(xf * xf, axis=0) / width
        normed = (xf * tl.math.rsqrt(variance + eps)).to(x.dtype)
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
        tl.store(out_ptr + row * width + cols, (weight.to(tl.float32) * normed.to(tl.float32)).to(x.dtype),
                 mask=mask)

    @triton.jit
    def rotary_kv_kernel(qkv_ptr, cos_ptr, sin_ptr, position_ptr, slots_ptr, q_ptr, keys_ptr, values_ptr,
                         stride_qkv, stride_rot, stride_slot, stride_head, stride_column, heads, kv_heads,
                         HEAD_DIM: tl.constexpr, GATHERED: tl.constexpr):
        row = tl.program_id(0)
        head = tl.program_id(1)
        half: tl.constexpr = HEAD_DIM // 2
        d = tl.arange(0, HEAD_DIM)
        partner = tl.where(d < half, d + half, d - half)  # rotate_half: (-x2, x1)
        sign = tl.where(d < half, -1.0, 1.0)
        cos = tl.load(cos_ptr + row * stride_rot + d).to(tl.float32)
        sin = tl.load(sin_ptr + row * stride_rot + d).to(tl.float32)
        base = qkv_ptr + row * stride_qkv
        q = tl.load(base + head * HEAD_DIM + d)
        dtype = q.dtype
        q_rot = tl.load(base + head * HEAD_DIM + partner).to(tl.float32) * sign
        # (q * cos) + (rotate_half(q) * sin), each product rounded as the module's ops round it.
        q = ((q.to(tl.float32) * cos).to(dtype).to(tl.float32) + (q_rot * sin).to(dtype).to(tl.float32)).to(dtype)
        tl.store(q_ptr + (row * heads + head) * HEAD_DIM + d, q)
        if head < kv_heads:
            k_at = base + (heads + head) * HEAD_DIM
            k = tl.load(k_at + d).to(tl.float32)
            k_rot = tl.load(k_at + partner).to(tl.float32) * sign
            k = ((k * cos).to(dtype).to(tl.float32) + (k_rot * sin).to(dtype).to(tl.float32)).to(dtype)
            v = tl.load(base + (heads + kv_heads + head) * HEAD_DIM + d)
            column = tl.load(position_ptr + row)
            slot = row
            if GATHERED:  # a gathered step's rows sit in any slots
                slot = tl.load(slots_ptr + row)
            at = slot * stride_slot + head * stride_head + column * stride_column + d
            tl.store(keys_ptr + at, k)
            tl.store(values_ptr + at, v)

    @triton.jit
    def silu_mul_kernel(gate_up_ptr, out_ptr, inter, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        gate = tl.load(gate_up_ptr + row * 2 * inter + cols, mask=mask, other=0.0)
        up = tl.load(gate_up_ptr + row * 2 * inter + inter + cols, mask=mask, other=0.0)
        g = gate.to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)
        tl.store(out_ptr + row * inter + cols, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=mask)

    return triton, add_rms_norm_kernel, rotary_kv_kernel, silu_mul_kernel


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + delta) * weight, x + delta)`` over rows ``[N, width]`` (``delta`` None: no add), as
    ``h = h + delta`` then ``LlamaRMSNorm(h)`` compute them."""
    triton, kernel, _, _ = _kernels()
    n, width = x.shape
    out = torch.empty_like(x)
    total = torch.empty_like(x) if delta is not None else x
    kernel[(n,)](x, delta if delta is not None else x, weight, out, total, width, eps,
                 HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(width))
    return out, total


def rotary_kv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position: torch.Tensor,
              keys: torch.Tensor, values: torch.Tensor, heads: int, kv_heads: int,
              slots: torch.Tensor | None = None) -> torch.Tensor:
    """One decode position per row: ``qkv [B, (heads + 2 kv_heads) * D]`` (the fused projection), ``cos``/``sin``
    ``[B, D]``-strided rows, ``position [B]``. Writes each row's rotated key and its value into slot ``row`` of
    ``keys``/``values`` (``[slots, kv_heads, columns, D]``), or slot ``slots[row]`` of a gathered step, at column
    ``position[row]``; returns the rotated queries ``[B, heads, 1, D]``."""
    _, _, kernel, _ = _kernels()
    b = qkv.shape[0]
    d = keys.shape[-1]
    if keys.stride() != values.stride() or keys.stride(-1) != 1 or qkv.stride(-1) != 1:
        raise ValueError("rotary_kv needs equal, contiguous key and value caches")
    q = torch.empty(b, heads, 1, d, dtype=qkv.dtype, device=qkv.device)
    kernel[(b, heads)](qkv, cos, sin, position, position if slots is None else slots, q, keys, values,
                       qkv.stride(0), cos.stride(0), keys.stride(0), keys.stride(1), keys.stride(2), heads, kv_heads,
                       HEAD_DIM=d, GATHERED=slots is not None)
    return q


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of the fused projection's output ``[N, 2 I]`` (gate first) -> ``[N, I]``."""
    triton, _, _, kernel = _kernels()
    n, width = gate_up.shape
    inter = width // 2
    out = torch.empty(n, inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    kernel[(n, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block)
    return out


@dataclass(frozen=True)
class FusedLayer:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(heads + 2 kv_heads) * D, hidden]: q, k, v projections stacked
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, hidden]: gate then up
    down: torch.Tensor


@dataclass(frozen=True)
class FusedTrunk:
    """The Llama body's weights as the fused decode reads them."""

    layers: tuple[FusedLayer, ...]
    norm: torch.Tensor
    eps: float
    heads: int
    kv_heads: int


def fusable(llama) -> str | None:
    """Why ``llama`` cannot take the fused decode, or None: plain bias-free linear projections and
    Llama's SiLU MLP are what the kernels compute."""
    for layer in llama.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
            if type(proj) is not nn.Linear or proj.bias is not None:
                return f"{type(proj).__name__} projections (the fused decode needs bias-free nn.Linear)"
    act = getattr(llama.config, "hidden_act", None)
    if act != "silu":
        return f"MLP activation {act!r} (the fused decode computes SiLU)"
    return None


def _stack(modules: list[nn.Linear]) -> torch.Tensor:
    """One weight for ``modules`` stacked by output; each module's weight becomes a view into it."""
    fused = torch.cat([m.weight.detach() for m in modules]).contiguous()
    first = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(fused[first:first + rows], requires_grad=False)
        first += rows
    return fused


def fuse_trunk(gpt) -> FusedTrunk:
    """Stack ``gpt``'s projections for the fused decode (once, before capture; raises when not ``fusable``)."""
    llama, s = gpt.llama, gpt.sizes
    reason = fusable(llama)
    if reason is not None:
        raise ValueError(f"fused decode: {reason}")
    layers = []
    for layer in llama.layers:
        attn, mlp = layer.self_attn, layer.mlp
        layers.append(FusedLayer(layer.input_layernorm.weight.detach(),
                                 _stack([attn.q_proj, attn.k_proj, attn.v_proj]), attn.o_proj.weight.detach(),
                                 layer.post_attention_layernorm.weight.detach(), _stack([mlp.gate_proj, mlp.up_proj]),
                                 mlp.down_proj.weight.detach()))
    return FusedTrunk(tuple(layers), llama.norm.weight.detach(), float(llama.norm.variance_epsilon),
                      s.num_attention_heads, s.num_key_value_heads)


def decode_trunk(trunk: FusedTrunk, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position: torch.Tensor,
                 keys: list[torch.Tensor], values: list[torch.Tensor], batch: int, length: int, attend,
                 slots: torch.Tensor | None = None) -> torch.Tensor:
    """The body's layers and final norm for one new position of slots ``[0, batch)``, or of slots ``slots [B]``
    (a gathered step): ``h [B, H]`` input embeddings, ``cos``/``sin`` ``[B, 1, D]``, ``position [B]``; each
    layer's key and value go into the row's slot of ``keys[i]``/``values[i]`` at ``position``;
    ``attend(q, keys, values)`` over columns ``[0, length)`` returns ``[B, heads, 1, D]`` (it is handed slots
    ``[0, batch)``, or every slot for a gathered step). Returns the final-normed hidden ``[B, H]``."""
    b = h.shape[0]
    cached = slice(0, batch) if slots is None else slice(None)
    last = len(trunk.layers) - 1
    normed, residual = add_rms_norm(h, None, trunk.layers[0].input_norm, trunk.eps)
    for i, layer in enumerate(trunk.layers):
        q = rotary_kv(F.linear(normed, layer.qkv), cos[:, 0], sin[:, 0], position, keys[i], values[i],
                      trunk.heads, trunk.kv_heads, slots)
        o = attend(q, keys[i][cached, :, :length], values[i][cached, :, :length])
        normed, residual = add_rms_norm(residual, F.linear(o.transpose(1, 2).reshape(b, -1), layer.o),
                                        layer.post_norm, trunk.eps)
        down = F.linear(silu_mul(F.linear(normed, layer.gate_up)), layer.down)
        normed, residual = add_rms_norm(residual, down, trunk.norm if i == last else trunk.layers[i + 1].input_norm,
                                        trunk.eps)
    return normed
