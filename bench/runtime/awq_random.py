"""An AWQ form of the benchmark's random checkpoint, by round-to-nearest (no calibration).

    python -m bench.runtime.awq_random SRC DST        # DST: SRC with asset/gpt in 4-bit AWQ GEMM form

For the GPU machine, where AutoAWQ (``chattts_runtime.quantize``) is not installed and a calibrated
full-size AWQ checkpoint made elsewhere would be more pieces to carry: the GPT body's linear weights
are quantized per group of ``group_size`` input channels to 4 bits with a zero point (asymmetric
min/max), packed in AWQ's GEMM layout (``qweight``/``qzeros`` int32, ``scales`` float16) with the
``quantization_config`` vLLM's AWQ loader reads, as ``chattts_runtime.quantize`` writes it. The
layout is what the runtime's own reader (``model/awq.py``) dequantizes, so a round trip is testable
on the CPU. It measures what AWQ weights do to memory and kernels; random weights say nothing of a
trained model's quality under calibration.
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # column k*8 + AWQ_ORDER[j] goes to nibble j of int k (model/awq.py reverses it)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def pack_columns(values: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int ``[rows, cols]`` (each < 2**bits) -> int32 ``[rows, cols * bits / 32]`` in AWQ's nibble order."""
    per = 32 // bits
    rows, cols = values.shape
    if cols % per:
        raise ValueError(f"{cols} columns do not pack into int32s of {per}")
    grouped = values.to(torch.int64).view(rows, cols // per, per)[:, :, list(AWQ_ORDER)]
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    packed = (grouped << shifts).sum(dim=-1)  # disjoint bits: the sum is the OR
    return (packed - ((packed >> 31) << 32)).to(torch.int32)  # the unsigned pattern as int32


def pack_gemm(weight: torch.Tensor, bits: int = 4, group_size: int = 128):
    """``nn.Linear`` weight ``[out, in]`` -> (qweight ``[in, out/8]``, qzeros ``[in/g, out/8]``, scales ``[in/g, out]``)."""
    w = weight.detach().float().t().contiguous()  # [in, out]
    n_in, n_out = w.shape
    if n_in % group_size:
        raise ValueError(f"group size {group_size} does not divide {n_in} input channels")
    top = (1 << bits) - 1
    groups = w.view(n_in // group_size, group_size, n_out)
    lo, hi = groups.amin(dim=1), groups.amax(dim=1)
    scales = ((hi - lo) / top).clamp(min=1e-8).to(torch.float16)
    s = scales.float()
    zeros = torch.round(-lo / s).clamp(0, top)
    q = torch.round(groups / s[:, None, :] + zeros[:, None, :]).clamp(0, top).view(n_in, n_out)
    return pack_columns(q.to(torch.int64), bits), pack_columns(zeros.to(torch.int64), bits), scales


def make_awq_checkpoint(src: Path, dst: Path, *, group_size: int = 128) -> Path:
    """``src`` copied to ``dst`` with the GPT body's linear layers in AWQ GEMM form (idempotent: an existing
    ``dst`` with an AWQ config is kept)."""
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    from chattts_runtime.model import config as layout  # noqa: PLC0415

    config_path = dst / layout.GPT_CONFIG
    if config_path.exists() and "quantization_config" in json.loads(config_path.read_text()):
        return dst
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    state = load_file(str(src / layout.GPT_WEIGHTS))
    body: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".")
        if leaf == "weight" and prefix.rpartition(".")[2] in LINEAR:
            qweight, qzeros, scales = pack_gemm(value, 4, group_size)
            body.update({f"{prefix}.qweight": qweight, f"{prefix}.qzeros": qzeros, f"{prefix}.scales": scales})
        else:
            body[key] = value.to(torch.float16) if value.is_floating_point() else value
    save_file({k: v.contiguous() for k, v in body.items()}, str(dst / layout.GPT_WEIGHTS))
    cfg = json.loads((src / layout.GPT_CONFIG).read_text())
    cfg["torch_dtype"] = "float16"
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                                  "version": "gemm", "modules_to_not_convert": None}
    config_path.write_text(json.dumps(cfg, indent=2))
    return dst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--group-size", type=int, default=128)
    args = p.parse_args(argv)
    print(make_awq_checkpoint(args.src, args.dst, group_size=args.group_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
