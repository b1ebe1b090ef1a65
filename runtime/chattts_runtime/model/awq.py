"""AWQ checkpoints (written by ``chattts_runtime.quantize``) read back: the GPT's
quantization_config, and GEMM-packed weights dequantized to dense ones for any device."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from chattts_runtime.model import config as layout

AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # GEMM packing order of 8 nibbles in an int32


def gpt_quantization(model_dir: Path) -> dict | None:
    data = json.loads((model_dir / layout.GPT_CONFIG).read_text())
    q = data.get("quantization_config")
    return q if isinstance(q, dict) else None


def dequantize_gemm(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, bits: int,
                    group_size: int) -> torch.Tensor:
    """AWQ GEMM tensors -> float weight ``[out, in]`` as ``nn.Linear`` stores it."""
    pack = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    order = torch.arange(qweight.shape[1] * pack).view(-1, pack)[:, list(AWQ_REVERSE_ORDER)].reshape(-1)
    mask = (1 << bits) - 1
    iweight = ((qweight.to(torch.int32)[:, :, None] >> shifts) & mask).reshape(qweight.shape[0], -1)[:, order]
    izeros = ((qzeros.to(torch.int32)[:, :, None] >> shifts) & mask).reshape(qzeros.shape[0], -1)[:, order]
    scales_full = scales.float().repeat_interleave(group_size, dim=0)
    zeros_full = izeros.repeat_interleave(group_size, dim=0).float()
    weight_in_out = (iweight.float() - zeros_full) * scales_full
    return weight_in_out.t().contiguous()


def dequantize_awq_state(state: dict[str, torch.Tensor], quant: dict) -> dict[str, torch.Tensor]:
    method = str(quant.get("quant_method", "")).lower()
    version = str(quant.get("version", "gemm")).lower()
    if method != "awq" or version != "gemm":
        raise layout.CheckpointError(f"unsupported quantization_config: quant_method={method!r} "
                                     f"version={version!r} (this runtime loads awq/gemm)")
    bits, group = int(quant.get("bits", quant.get("w_bit", 4))), int(quant.get("group_size", quant.get("q_group_size", 128)))
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith(".qweight"):
            prefix = key[: -len(".qweight")]
            try:
                out[prefix + ".weight"] = dequantize_gemm(value, state[prefix + ".qzeros"], state[prefix + ".scales"],
                                                          bits, group)
            except KeyError as err:
                raise layout.CheckpointError(f"AWQ layer {prefix} lacks {err}") from None
        elif key.endswith((".qzeros", ".scales")):
            continue
        else:
            out[key] = value
    return out
