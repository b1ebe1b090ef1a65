"""The ragged decode-attention kernel against masked SDPA, attention alone, on the GPU.

``python -m bench.runtime.attention_sweep`` (CUDA + Triton): one layer's attention of the full-size
GPT (12 heads of 64) over a slot cache of 16-bit keys/values, per (batch, length bucket, contexts),
median of CUDA-graph replays, for a few kernel configurations (block, warps, stages) beside
``scaled_dot_product_attention`` with each row's mask; and the largest difference of each against
SDPA. Contexts "mixed": each row's drawn from [32, bucket), one at the end; "full": all at the end.
Chooses the configuration the graph engine uses (engines/attention.py) from these figures.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.runtime.gpu_timing import event_median_ms


def main() -> int:
    import torch
    import torch.nn.functional as F

    from chattts_runtime.engines.attention import ragged_decode_attention

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--dtype", default="float16")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    heads, dim, slots, max_len = 12, 64, 257, 2048
    keys = torch.randn(slots, heads, max_len, dim, device="cuda", dtype=dtype)
    values = torch.randn_like(keys)
    gen = torch.Generator().manual_seed(0)
    configs = [(32, 2, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3), (64, 2, 2)]
    report = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "dtype": args.dtype, "cases": {}}

    def timed(fn) -> float:
        fn()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return round(event_median_ms(graph.replay, runs=50, warmup=10) * 1000, 1)  # microseconds

    with torch.inference_mode():
        for batch in (1, 16, 64, 128, 256):
            for length in (256, 1024, 2048):
                for contexts in ("mixed", "full"):
                    lengths = torch.randint(32, length, (batch,), generator=gen)
                    if contexts == "full":
                        lengths[:] = length
                    lengths[0] = length
                    lengths = lengths.cuda()
                    q = torch.randn(batch, heads, 1, dim, device="cuda", dtype=dtype)
                    k, v = keys[:batch, :, :length], values[:batch, :, :length]
                    mask = (torch.arange(length, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
                    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                    row = {"sdpa_us": timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))}
                    for block, warps, stages in configs:
                        name = f"ragged_b{block}_w{warps}_s{stages}"
                        out = ragged_decode_attention(q, k, v, lengths, length, block=block, warps=warps,
                                                      stages=stages)
                        row[name + "_us"] = timed(lambda: ragged_decode_attention(
                            q, k, v, lengths, length, block=block, warps=warps, stages=stages))
                        row[name + "_maxdiff"] = float((out.float() - reference.float()).abs().max())
                    report["cases"][f"{batch}x{length}/{contexts}"] = row
                    print(f"{batch}x{length}/{contexts}", json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
