"""The GPU scripts of issue #15 on CPU with the tiny checkpoint: the memory probe (measured vs
the operator's planner, per engine) and the bf16 / float32 agreement. On CPU they measure no CUDA
memory, so these tests check what they run and what they predict and compare."""
from __future__ import annotations

import json

import numpy as np

from bench.runtime import dtype_agreement, memory_probe


def test_memory_probe_runs_each_engine_and_reports_the_planners_prediction(tmp_path):
    assert memory_probe.main(["--out", str(tmp_path), "--size", "tiny", "--seqs", "2", "--device", "cpu",
                              "--reference-max-model-len", "96"]) == 0
    report = json.loads(next(tmp_path.glob("memory-probe-cpu-*.json")).read_text())
    rows = {r["engine"]: r for r in report["rows"]}
    assert set(rows) == {"graph", "reference"}
    for kind, row in rows.items():
        assert "error" not in row, row
        assert row["frames_generated"] == row["seqs"] * row["frames_per_request"] > 0
        parts = row["parts"]
        assert row["predicted_allocator_mib"] == sum(v for k, v in parts.items() if k != "cudaContexts")
        assert row["predicted_process_mib"] == row["predicted_allocator_mib"] + parts["cudaContexts"]
        assert "speechApiDecode" not in parts  # the speech API's process is not part of the probe
        assert f"{kind} engine" in row["plan_message"]
    # The graph engine's slot cache: (seqs + 1) x maxModelLen x KV bytes per token of the tiny model
    # (2 layers, 2 heads of 32, float32 on CPU: 2 x 2 x 2 x 32 x 4 = 1 KiB per token).
    graph = rows["graph"]
    assert graph["parts"]["kvCache"] == -(-(2 + 1) * graph["max_model_len"] * 1024 // 2**20)
    assert rows["reference"]["max_model_len"] == 96
    table = next(tmp_path.glob("memory-probe-cpu-*.md")).read_text()
    assert "| graph | 2 | 1024 |" in table and "| reference | 2 | 96 |" in table


def test_compare_identical_and_different_outputs():
    codes = np.arange(40, dtype=np.int64).reshape(10, 4)
    audio = np.sin(np.linspace(0, 200, 5120)).astype(np.float32)
    same = dtype_agreement.compare(codes, codes.copy(), audio, audio.copy())
    assert same["agreement"] == 1.0 and same["first_difference"] == 10 and same["mel_l1"] == 0.0
    assert same["snr_db"] == float("inf")
    other = codes.copy()
    other[6:, 2] += 1
    noisy = audio + 0.01 * np.cos(np.linspace(0, 50, 5120)).astype(np.float32)
    diff = dtype_agreement.compare(codes, other, audio, noisy)
    assert diff["agreement"] == 0.6 and diff["first_difference"] == 6
    assert 30 < diff["snr_db"] < 45 and diff["mel_l1"] > 0


def test_dtype_agreement_runs_every_prompt_in_both_modes(tmp_path):
    assert len(dtype_agreement.PROMPTS) >= 16
    assert dtype_agreement.main(["--out", str(tmp_path), "--size", "tiny", "--frames", "8", "--device", "cpu"]) == 0
    report = json.loads(next(tmp_path.glob("dtype-agreement-cpu-*.json")).read_text())
    assert set(report["against_float32"]) == {"bfloat16", "float16"}
    for data in (d for modes in report["against_float32"].values() for d in modes.values()):
        rows = data["rows"]
        assert len(rows) == len(dtype_agreement.PROMPTS)
        assert all(r["frames"] == 8 and r["length_equal"] and r["finite"] for r in rows)
        summary = data["summary"]
        assert 0.0 <= summary["frame_agreement"] <= 1.0
        assert summary["frame_agreement"] == sum(r["frames_equal"] for r in rows) / (8 * len(rows))
    assert set(report["against_float32"]["bfloat16"]) == {"greedy", "seeded"}
    assert "| bfloat16 | greedy |" in next(tmp_path.glob("dtype-agreement-cpu-*.md")).read_text()
    # The audio decoders with TF32 products against float32: on the CPU they are the same audio.
    tf32 = report["audio_tf32_vs_float32"]
    assert len(tf32["rows"]) == len(dtype_agreement.PROMPTS)
    assert set(tf32["summary"]) == {"dvae", "decoder"}
    assert all(s["snr_db_median"] == float("inf") and s["mel_l1_mean"] == 0.0 for s in tf32["summary"].values())
    assert "| Decoder + Vocos" in next(tmp_path.glob("dtype-agreement-cpu-*.md")).read_text()
