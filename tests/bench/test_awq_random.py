"""bench.runtime.awq_random: round-to-nearest AWQ packing read back by the runtime's own AWQ reader."""
from __future__ import annotations

import json

import torch

from bench.runtime.awq_random import make_awq_checkpoint, pack_gemm
from chattts_runtime.model.awq import dequantize_gemm


def test_packed_weights_dequantize_to_within_half_a_step():
    torch.manual_seed(0)
    weight = torch.randn(96, 256) * 0.05
    qweight, qzeros, scales = pack_gemm(weight, 4, 128)
    assert qweight.dtype == qzeros.dtype == torch.int32 and scales.dtype == torch.float16
    assert qweight.shape == (256, 12) and qzeros.shape == (2, 12) and scales.shape == (2, 96)
    back = dequantize_gemm(qweight, qzeros, scales, 4, 128)
    step = scales.float().repeat_interleave(128, dim=0).t()  # [out, in]
    assert back.shape == weight.shape
    assert bool(((back - weight).abs() <= step * 0.5 + 1e-3).all())
    # Every code is used somewhere: a packing order mistake would scramble, not just blur, the weights.
    assert (back - weight).abs().mean() < 0.25 * step.mean()


def test_the_awq_checkpoint_loads_in_the_runtime_with_weights_near_the_dense_ones(tmp_path):
    from chattts_runtime.model import load_chattts
    from chattts_runtime.model.awq import gpt_quantization
    from chattts_runtime.testing import make_tiny_checkpoint

    tiny_checkpoint = make_tiny_checkpoint(tmp_path / "tiny")
    dst = make_awq_checkpoint(tiny_checkpoint, tmp_path / "awq", group_size=32)
    quant = gpt_quantization(dst)
    assert quant["quant_method"] == "awq" and quant["version"] == "gemm" and quant["group_size"] == 32
    assert json.loads((dst / "asset" / "gpt" / "config.json").read_text())["torch_dtype"] == "float16"
    dense, awq = load_chattts(tiny_checkpoint), load_chattts(dst)
    for name, param in dense.gpt.llama.named_parameters():
        other = dict(awq.gpt.llama.named_parameters())[name]
        assert other.shape == param.shape
        if name.endswith("_proj.weight"):
            assert (other - param).abs().max() < 0.5 * (param.max() - param.min()) / 15 + 1e-3, name
    assert make_awq_checkpoint(tiny_checkpoint, dst, group_size=32) == dst  # kept, not rewritten
