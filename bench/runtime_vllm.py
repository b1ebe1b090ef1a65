"""Runtime benchmark, vLLM section: the speech API on the vllm engine beside the reference engine.

    .venv-vllm/bin/python -m bench.runtime_vllm                 # CPU, tiny model
    .venv-vllm/bin/python -m bench.runtime_vllm --size small --concurrency 1,4,16,32

Same method as ``bench.runtime`` (whose client, levels and percentiles it reuses), in one
run: for each engine in turn (reference first, then vllm; never two engines at once) it
starts ``chattts-runtime serve`` on loopback with the same random checkpoint (``endless``:
every request yields exactly ``--frames`` frames), runs a one-at-a-time baseline, then
closed-loop clients at each concurrency level, streaming PCM. Reported per level:
throughput (audio seconds per wall second), p50/p99 time to first audio, RTF, mean
``vllm:scheduler_deadline_wait_seconds`` and mean batch size, and the vllm/reference ratios.

Writes ``bench/results/runtime-vllm-<device>-<date>.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.runtime import launch, loadgen
from bench.runtime.speech_api import (
    BENCH_TEXTS, RESULTS, SAMPLE_RATE, bench_checkpoint, environment, run_level, wait_ready)

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("reference", "vllm")


def start_server(engine_kind: str, checkpoint: Path, args, log: Path):
    """``launch.start`` of this comparison's config for ``engine_kind``: (process, url)."""
    settings = {
        "model": {"path": str(checkpoint)}, "engine_kind": engine_kind, "device": args.device,
        "engine": {"max_num_seqs": args.max_num_seqs, "max_model_len": 4096,
                   "dtype": "float32" if args.device == "cpu" else "bfloat16", "enforce_eager": args.eager},
        "server": {"max_queue": 4096},
        "generation": {"temperature": 0.3, "seed": 0, "max_new_frames": args.frames,
                       "stream_chunk_frames": args.chunk_frames},
    }
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "chattts-operator" / "vllm"
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
           "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(cache / "cache")),
           "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))}
    server = launch.start(settings, log, env=env)
    return server.proc, server.url


async def bench_engine(engine_kind: str, checkpoint: Path, args, levels: list[int], texts: list[str]) -> dict:
    log = RESULTS / "tmp" / f"bench-vllm-section-{engine_kind}.log"
    proc, url = start_server(engine_kind, checkpoint, args, log)
    try:
        t0 = time.perf_counter()
        await wait_ready(url, proc, timeout=900)
        startup = time.perf_counter() - t0
        sequential = await run_level(url, 1, args.sequential, texts)
        rows = []
        for c in levels:
            row = await run_level(url, c, args.rounds, texts)
            rows.append(row)
            print(f"{engine_kind} concurrency {c}: {row['throughput_audio_s_per_s']:.2f} audio s/s, ttfa p50 "
                  f"{row['ttfa_p50_s']:.3f} p99 {row['ttfa_p99_s']:.3f}, batch {row['mean_batch_size']}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    return {"server_startup_s": startup, "sequential": sequential, "levels": rows}


def _fmt(value, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def write_report(report: dict, stem: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    jpath, mpath = RESULTS / f"{stem}.json", RESULTS / f"{stem}.md"
    jpath.write_text(json.dumps(report, indent=2))
    p = report["params"]
    ref, vl = report["engines"]["reference"], report["engines"]["vllm"]
    lines = [
        f"# Runtime benchmark, vllm engine beside the reference engine ({report['date']})",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Model: `{p['size']}` random weights ({p['model']}), {p['dtype']}, {p['frames']} frames per request "
        f"({p['frames'] * 512 / SAMPLE_RATE:.2f} s of audio), streaming PCM through the speech API, sampling "
        f"(temperature 0.3), max_num_seqs {p['max_num_seqs']}, enforce_eager {p['eager']}. "
        f"Environment: {json.dumps(report['environment'])}.",
        "",
        f"Server start-up: reference {ref['server_startup_s']:.1f} s, vllm {vl['server_startup_s']:.1f} s.",
        "",
        "| engine | concurrency | requests | throughput (audio s / s) | vs own sequential | TTFA p50 (s) "
        "| TTFA p99 (s) | RTF p50 | deadline wait mean (s) | mean batch |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ENGINES:
        eng = report["engines"][name]
        base = eng["sequential"]["throughput_audio_s_per_s"]
        for row in [eng["sequential"], *eng["levels"]]:
            label = f"{name} (sequential)" if row is eng["sequential"] else name
            lines.append(
                f"| {label} | {row['concurrency']} | {row['requests']} | {row['throughput_audio_s_per_s']:.2f} "
                f"| {row['throughput_audio_s_per_s'] / base:.2f}x | {row['ttfa_p50_s']:.3f} | {row['ttfa_p99_s']:.3f} "
                f"| {row['rtf_p50']:.3f} | {_fmt(row['deadline_wait_mean_s'], 4)} | {_fmt(row['mean_batch_size'], 2)} |")
    lines += ["", "| concurrency | throughput vllm / reference | TTFA p99 vllm / reference |", "|---|---|---|"]
    for r_row, v_row in zip(ref["levels"], vl["levels"]):
        lines.append(f"| {r_row['concurrency']} | "
                     f"{v_row['throughput_audio_s_per_s'] / r_row['throughput_audio_s_per_s']:.2f}x | "
                     f"{v_row['ttfa_p99_s'] / r_row['ttfa_p99_s']:.2f}x |")
    lines += ["", "TTFA: request sent -> first PCM bytes. RTF: request wall time / audio duration. Throughput: "
              "audio seconds delivered per wall second over the level. Both engines ran in the same benchmark "
              "process, one after the other, on the same checkpoint and requests; the machine's load average at "
              "start is in the environment line (a shared 2-core machine: compare the ratios, not the absolutes)."]
    mpath.write_text("\n".join(lines) + "\n")
    return jpath, mpath


async def main_async(args) -> dict:
    checkpoint, g = bench_checkpoint(args.size)
    if g.hidden_size // g.num_attention_heads < 32:
        raise SystemExit("vLLM's CPU attention needs head_dim >= 32: choose another --size")
    levels = [int(c) for c in args.concurrency.split(",")]
    texts = BENCH_TEXTS
    engines = {}
    for name in ENGINES:
        engines[name] = await bench_engine(name, checkpoint, args, levels, texts)
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python -m bench.runtime_vllm " + " ".join(sys.argv[1:]),
        "params": {"size": args.size, "frames": args.frames, "sequential": args.sequential, "rounds": args.rounds,
                   "chunk_frames": args.chunk_frames, "max_num_seqs": args.max_num_seqs, "eager": args.eager,
                   "dtype": "float32" if args.device == "cpu" else "bfloat16",
                   "model": f"GPT hidden {g.hidden_size}, {g.num_hidden_layers} layers, {g.num_attention_heads} heads"},
        "environment": environment(args.device, loadgen.pick_client_lib("auto")),
        "engines": engines,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runtime_vllm", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--size", default="tiny", choices=("tiny", "small", "full"))
    p.add_argument("--frames", type=int, default=64, help="frames per request (21.3 ms of audio each)")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--sequential", type=int, default=4, help="requests in each engine's one-at-a-time baseline")
    p.add_argument("--rounds", type=int, default=2, help="requests per client at each concurrency level")
    p.add_argument("--chunk-frames", type=int, default=16, help="frames per streamed audio chunk")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM without torch.compile (CPU start-up is much shorter)")
    p.add_argument("--tag", default=None, help="file name tag (default: <device>-<date>)")
    args = p.parse_args(argv)
    report = asyncio.run(main_async(args))
    stem = f"runtime-vllm-{args.tag or args.device + '-' + dt.date.today().isoformat()}"
    jpath, mpath = write_report(report, stem)
    print(mpath.read_text())
    print(f"wrote {jpath} and {mpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
