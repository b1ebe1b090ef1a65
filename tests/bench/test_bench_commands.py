"""Every benchmark command runs on the CPU at its tiniest, so a broken benchmark fails CI rather than a
GPU call (issue #30: `bench.runtime` once wrote a config the runtime refused, and nothing ran it).

* ``bash bench/runtime/h200.sh --smoke``: every step of the GPU script at the tiny size, one level, one
  round, with an ``--ab`` arm on this very revision and a ``--vs`` arm of one more engine setting; CUDA-only
  steps are parsed.
* ``python -m bench.*``: each module's command line at its smallest size; the ones that need CUDA show
  their ``--help`` (argument parsing before any CUDA call). The cluster benchmarks run in tests/cluster,
  the vLLM ones in tests/vllm_engine.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
STEPS = ("anchor graph_check gathered engine_load graph faithful faithful_norefine faithful_ownvoice faithful_stream "
         "fixed128 fixed128_decoder windows upstream memprobe dtype reference loadgen")


def _env(tmp_path: Path) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
            "BENCH_RESULTS": str(tmp_path / "results"), "PYTHONUNBUFFERED": "1"}


def _run(cmd: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return out


def test_every_step_of_the_gpu_script_runs_at_the_tiny_size_with_an_ab_arm(tmp_path):
    subprocess.run(["bash", "bench/runtime/ab_prepare.sh", "HEAD"], cwd=REPO, check=True, capture_output=True)
    out_dir = tmp_path / "out"
    # The graph step's A arm is profiled; on the CPU the engine runs in the server's process, which profiles.
    env = {**_env(tmp_path), "OUT": str(out_dir), "GPU_PROFILE_PROCESS": "MainProcess", "GPU_PROFILE_DELAY_S": "1",
           "GPU_PROFILE_WINDOW_S": "0.2", "GPU_PROFILE_COUNT": "1"}
    proc = subprocess.run(["bash", "bench/runtime/h200.sh", "--smoke", "--steps", STEPS, "--ab", "HEAD=graph",
                           "--vs", "audio_batch_rows=1@graph", "--gpu-profile", "graph", "--budget", "3000"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=3300)
    summary = (out_dir / "summary.txt").read_text() if (out_dir / "summary.txt").exists() else ""
    assert proc.returncode == 0, f"h200.sh --smoke failed:\n{summary}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    for step in [*STEPS.split(), "graph@HEAD", "graph@audio_batch_rows-1"]:
        assert re.search(rf"^{re.escape(step)}: passed", summary, re.M), f"{step} did not pass:\n{summary}"
    # The A/B summary compares the two arms level by level.
    assert summary.count("A/B graph") == 2 and re.search(r"^2 \| [\d.]+, [\d.]+, [\d.]+x", summary, re.M), summary
    # Results went to the smoke's own folder, none among the recorded ones.
    assert not list((REPO / "bench" / "results").glob("runtime-h200-*-smoke*"))
    for name in ("summary.txt", "results.tar.gz", "logs.tar.gz"):
        assert (out_dir / name).stat().st_size > 0
    with tarfile.open(out_dir / "logs.tar.gz") as logs:
        profiles = [n for n in logs.getnames() if re.search(r"gpu-profile-graph/gpu-profile-\d+-0\.json$", n)]
    assert profiles, "the profiled step left no summary"


def test_the_gpu_script_refuses_a_typo_before_it_runs_anything(tmp_path):
    for args in (["--steps", "graph faithfull"], ["--ab", "HEAD"], ["--ab", "HEAD=anchor", "--steps", "anchor"],
                 ["--vs", "audio_batch_rows"], ["--vs", "=1@graph"], ["--vs", "audio_batch_rows=1@"],
                 ["--no-such-flag"]):
        proc = subprocess.run(["bash", "bench/runtime/h200.sh", "--smoke", *args], cwd=REPO, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "h200.sh:" in proc.stderr


def test_every_step_an_ab_arm_may_name_has_a_tag_the_ab_summary_reads():
    """--ab and --vs accept the steps of AB_ABLE; the summary after them must find each one's report files,
    or an A/B of a new step measures on the GPU and then says nothing."""
    from bench.runtime.ab_summary import STEP_TAGS

    script = (REPO / "bench" / "runtime" / "h200.sh").read_text()
    ab_able = re.search(r'^AB_ABLE="([^"]+)"', script, re.M).group(1).split()
    assert sorted(ab_able) == sorted(STEP_TAGS)
    for step, tag in STEP_TAGS.items():  # the tag each step's command gives its report
        assert re.search(rf"^\s+{step}\) echo .*--tag \$GPU_TAG-\$DATE-{re.escape(tag)}\"", script, re.M), step


def test_bench_runtime_reports_ttfa_per_class_and_the_first_audios_parts(tmp_path):
    _run([sys.executable, "-m", "bench.runtime", "--device", "cpu", "--size", "tiny", "--mixed", "--frames", "64",
          "--refine", "on", "--audio-decoder", "decoder", "--concurrency", "2", "--sequential", "1", "--rounds", "1",
          "--engine", "graph", "--max-model-len", "1024", "--tag", "cpu-parts",
          "--engine-setting", "first_audio_substeps=2", "--engine-setting", "playing_realtime=1.5",
          "--engine-setting", "generation.stream_max_chunk_frames=48"], tmp_path, timeout=900)
    report = json.loads((tmp_path / "results" / "runtime-cpu-parts.json").read_text())
    # A dotted setting lands in its own section of the server's config; the others in engine.
    configs = [yaml.safe_load(p.read_text()) for p in (tmp_path / "results" / "tmp").glob("bench-server-*.yaml")]
    assert configs and all(c["generation"]["stream_max_chunk_frames"] == 48 and c["engine"]["first_audio_substeps"] == 2
                           for c in configs), configs
    level = report["levels"][-1]
    assert level["ttfa_by_class"], level
    parts = {part for part in level["first_audio_parts"]}
    assert {"refine", "after_headers"} <= parts, parts
    # Where the streams were: sampled from the server's gauges while the level ran.
    occupied = level["occupancy"]
    assert occupied["samples"] >= 1 and occupied["running"] + occupied["waiting"] > 0, occupied
    # The graph engine's loop account reaches the report (every 0.25 s of work on CPU; a level runs for seconds).
    loops = [row["engine_loop"] for row in [report["sequential"], *report["levels"]] if row.get("engine_loop")]
    assert loops and all(sum(loop["rows_per_step"].values()) > 0 for loop in loops), loops
    assert all("substeps_per_s" in loop for loop in loops), loops
    # Each row attends over at least its prompt: more positions read than rows stepped, within the bucket.
    assert all(sum(loop["rows_per_step"].values()) < loop["kv_positions_per_step"]
               <= (sum(loop["rows_per_step"].values()) + loop["idle_rows_per_step"]) * loop["length_bucket_per_step"]
               for loop in loops), loops
    assert all(loop["scope"] in ("steady window", "level") and loop["began_at"] <= loop["ended_at"]
               for loop in loops), loops
    assert "| concurrency | decode steps/s (first-audio substeps) |" in (
        tmp_path / "results" / "runtime-cpu-parts.md").read_text()
    assert report["params"]["engine_settings"] == {"first_audio_substeps": 2, "playing_realtime": 1.5,
                                                   "generation.stream_max_chunk_frames": 48}


def test_an_engine_setting_the_runtime_refuses_stops_the_benchmark_before_it_serves(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.runtime", "--device", "cpu", "--size", "tiny", "--engine", "graph",
                           "--concurrency", "1", "--engine-setting", "first_audio_substeps=-1"],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "first_audio_substeps" in proc.stderr, proc.stderr[-2000:]
    bad = subprocess.run([sys.executable, "-m", "bench.runtime", "--engine-setting", "no-equals-sign"],
                         cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr


CPU_COMMANDS = {
    "autoscaler": ["bench.autoscaler", "--traces", "bursts", "--calibrations", "anchor", "--no-plots", "--out", "{tmp}"],
    "stages": ["bench.stages", "--size", "tiny", "--requests", "1", "--frames", "8", "--refine-tokens", "8"],
    "text_frontend": ["bench.text_frontend", "--repeat", "1", "--out", "{tmp}/text-frontend.md"],
    "operator_desired_state": ["bench.operator_desired_state"],
    "ttfb_formats": ["bench.runtime.ttfb_formats", "--size", "tiny", "--device", "cpu", "--requests", "1",
                     "--frames", "16"],
    "api_cpu": ["bench.runtime.api_cpu", "--requests", "8", "--concurrency", "2", "--out", "{tmp}/api-cpu.json"],
    "engine_load": ["bench.runtime.engine_load", "--engine", "reference", "--size", "tiny", "--frames", "8",
                    "--rounds", "1", "--concurrency", "2", "--out", "{tmp}/engine-load.json"],
    "window_schedule": ["bench.runtime.window_schedule", "--size", "tiny", "--streams", "2", "--repeats", "1",
                        "--lengths", "40,70", "--out", "{tmp}", "--tag", "smoke"],
    # CUDA-only: their command lines parse here; they run in h200.sh on the GPU.
    "graph_check": ["bench.runtime.graph_check", "--help"],
    "decode_check": ["bench.runtime.decode_check", "--help"],
    "attention_sweep": ["bench.runtime.attention_sweep", "--help"],
    "ab_summary": ["bench.runtime.ab_summary", "--help"],
}


@pytest.mark.parametrize("name", sorted(CPU_COMMANDS))
def test_bench_command_runs_at_its_tiniest(name, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in CPU_COMMANDS[name]]
    _run([sys.executable, "-m", *args], tmp_path, timeout=900)


def test_window_schedules_decode_less_as_chunks_grow_and_near_the_whole_piece_with_a_lookahead(tmp_path):
    _run([sys.executable, "-m", "bench.runtime.window_schedule", "--size", "tiny", "--streams", "2", "--repeats", "1",
          "--lengths", "60,200", "--max-chunks", "48,96", "--lookaheads", "4", "--out", str(tmp_path), "--tag", "t"],
         tmp_path, timeout=900)
    rows = json.loads((tmp_path / "window-schedule-t.json").read_text())["rows"]
    for path in ("decoder", "dvae"):
        mine = {(r["max_chunk_frames"], r["lookahead_frames"]): r for r in rows if r["path"] == path}
        assert sorted(mine) == [(24, 0), (24, 4), (48, 0), (48, 4), (96, 0), (96, 4)]
        assert mine[(24, 0)]["vs_base"] == 1.0
        for ahead in (0, 4):
            decoded = [mine[(top, ahead)]["decoded_per_frame"] for top in (24, 48, 96)]
            windows = [mine[(top, ahead)]["windows_per_piece"] for top in (24, 48, 96)]
            assert decoded == sorted(decoded, reverse=True) and decoded[2] < decoded[0]
            assert windows == sorted(windows, reverse=True) and windows[2] < windows[0]
            # fewer window ends decoded without their future: no farther from the whole piece than 24-frame chunks
            assert mine[(96, ahead)]["snr_db_median"] >= mine[(24, ahead)]["snr_db_median"] - 0.5
        for top in (24, 48, 96):  # the lookahead waits for those frames: far nearer the whole piece
            assert mine[(top, 4)]["snr_db_min"] > mine[(top, 0)]["snr_db_median"] + 20
    assert "| decoder | 96 | 4 | [24, 48, 96] |" in (tmp_path / "window-schedule-t.md").read_text()
