"""Runtime benchmark: the speech API under rising concurrency vs one-at-a-time generation.

    python -m bench.runtime                      # CPU, small model (~3 minutes here)
    python -m bench.runtime --device cuda --size full --concurrency 1,16,64,256

What it does, all in one run and against one server process:

1. writes a random checkpoint of the chosen size (official layout; ``endless`` so every
   request yields exactly ``--frames`` frames) under ``bench/results/tmp/``;
2. starts ``chattts-runtime serve`` (reference engine, streaming PCM) on loopback;
3. baseline: ``--sequential`` requests one after another (no overlap, batch size 1);
4. for each concurrency C: C closed-loop clients, each sending requests back to back
   for ``--rounds`` rounds;
5. records per request the time to first audio (first PCM bytes), the real-time factor
   (request wall time / audio duration) and, per level, throughput (audio seconds
   produced per wall second) and its ratio to the sequential baseline; plus the
   server's own ``vllm:scheduler_deadline_wait_seconds`` and mean batch size.

Writes ``bench/results/runtime-<device>-<date>.json`` and ``.md``.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
SAMPLE_RATE = 24_000
BYTES_PER_FRAME = 512 * 2  # 512 samples of 16-bit PCM per GPT frame

SIZES = {
    # name: (hidden, layers, heads)
    "tiny": (64, 2, 2),
    "small": (256, 6, 8),
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def make_checkpoint(size: str, path: Path) -> Path:
    from chattts_runtime import testing

    if (path / "asset" / "gpt" / "config.json").exists():
        return path
    sizes = testing.full_sizes() if size == "full" else testing.tiny_sizes(*SIZES[size])
    return testing.make_checkpoint(path, sizes, seed=0, endless=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(checkpoint: Path, device: str, frames: int, max_seqs: int, chunk: int, log: Path,
                 engine: str = "reference", max_model_len: int = 4096):
    import yaml

    port = free_port()
    cfg = {
        "model": {"path": str(checkpoint)}, "engine_kind": engine, "device": device,
        "engine": {"max_num_seqs": max_seqs, "max_model_len": max_model_len},
        "server": {"host": "127.0.0.1", "port": port, "max_queue": 4096},
        "generation": {"temperature": 0.3, "seed": 0, "max_new_frames": frames, "stream_chunk_frames": chunk},
    }
    cfg_path = log.with_suffix(".yaml")
    cfg_path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATTTS_")}
    proc = subprocess.Popen([sys.executable, "-m", "chattts_runtime", "serve", "--config", str(cfg_path)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return proc, f"http://127.0.0.1:{port}"


async def wait_ready(url: str, proc, timeout: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if (await client.get(url + "/ready", timeout=2)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
    raise RuntimeError("server did not become ready")


async def one_request(client, text: str) -> dict:
    body = {"model": "chattts", "voice": "alloy", "input": text, "response_format": "pcm", "stream": True}
    start = time.perf_counter()
    first = None
    received = 0
    async with client.stream("POST", "/v1/audio/speech", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
        async for chunk in r.aiter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - start
            received += len(chunk)
    total = time.perf_counter() - start
    audio_s = received / 2 / SAMPLE_RATE
    return {"ttfa": first, "total": total, "audio_s": audio_s, "rtf": total / audio_s if audio_s else float("nan")}


async def scrape(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=url, timeout=30) as fresh:  # no stale keep-alive connection
        text = (await fresh.get("/metrics")).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("vllm:scheduler_deadline_wait_seconds_sum", "vllm:scheduler_deadline_wait_seconds_count",
                          "chattts_batch_size_sum", "chattts_batch_size_count"):
                out[s.name] = s.value
    return out


async def run_level(url: str, concurrency: int, requests_per_client: int, texts: list[str]) -> dict:
    import httpx

    # Drop idle connections before the server's 5 s keep-alive timeout closes them under us.
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4,
                          keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(600.0), limits=limits) as client:
        before = await scrape(url)
        results: list[dict] = []

        async def worker(w: int) -> None:
            for r in range(requests_per_client):
                results.append(await one_request(client, texts[(w * requests_per_client + r) % len(texts)]))

        wall0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - wall0
        after = await scrape(url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    ttfa = [r["ttfa"] for r in results]
    rtf = [r["rtf"] for r in results]
    audio = sum(r["audio_s"] for r in results)
    waits = delta("vllm:scheduler_deadline_wait_seconds_count")
    steps = delta("chattts_batch_size_count")
    return {
        "concurrency": concurrency, "requests": len(results), "wall_s": wall, "audio_s": audio,
        "throughput_audio_s_per_s": audio / wall,
        "ttfa_p50_s": percentile(ttfa, 0.5), "ttfa_p99_s": percentile(ttfa, 0.99),
        "rtf_p50": percentile(rtf, 0.5), "rtf_p99": percentile(rtf, 0.99),
        "deadline_wait_mean_s": delta("vllm:scheduler_deadline_wait_seconds_sum") / waits if waits else None,
        "mean_batch_size": delta("chattts_batch_size_sum") / steps if steps else None,
    }


def environment(device: str) -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device}
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        info["load_average_at_start"] = os.getloadavg()
    except OSError:
        pass
    return info


def write_report(report: dict, stem: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    jpath, mpath = RESULTS / f"{stem}.json", RESULTS / f"{stem}.md"
    jpath.write_text(json.dumps(report, indent=2))
    p = report["params"]
    lines = [
        f"# Runtime benchmark: {report['environment'].get('gpu', 'CPU')} ({report['date']})",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Model: `{p['size']}` random weights ({p['model']}), {p.get('engine', 'reference')} engine, {p['dtype']}, "
        f"{p['frames']} frames per request ({p['frames'] * 512 / SAMPLE_RATE:.2f} s of audio), streaming PCM "
        f"through the speech API, sampling (temperature 0.3). Environment: "
        f"{json.dumps(report['environment'])}.",
        "",
        "| mode | concurrency | requests | throughput (audio s / s) | vs sequential | TTFA p50 (s) | TTFA p99 (s) "
        "| RTF p50 | RTF p99 | deadline wait mean (s) | mean batch |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = report["sequential"]["throughput_audio_s_per_s"]
    for row in [report["sequential"], *report["levels"]]:
        mode = "sequential (baseline)" if row is report["sequential"] else "concurrent"
        lines.append(
            f"| {mode} | {row['concurrency']} | {row['requests']} | {row['throughput_audio_s_per_s']:.2f} "
            f"| {row['throughput_audio_s_per_s'] / base:.2f}x | {row['ttfa_p50_s']:.3f} | {row['ttfa_p99_s']:.3f} "
            f"| {row['rtf_p50']:.3f} | {row['rtf_p99']:.3f} | "
            f"{row['deadline_wait_mean_s'] if row['deadline_wait_mean_s'] is None else round(row['deadline_wait_mean_s'], 4)} "
            f"| {row['mean_batch_size'] if row['mean_batch_size'] is None else round(row['mean_batch_size'], 2)} |")
    lines += ["", "TTFA: request sent -> first PCM bytes. RTF: request wall time / audio duration (< 1 is faster "
              "than real time). Throughput: audio seconds delivered per wall second over the level. Percentiles "
              "over all requests of a level; the sequential baseline runs the same requests one at a time in the "
              "same server process, before the concurrent levels."]
    mpath.write_text("\n".join(lines) + "\n")
    return jpath, mpath


async def main_async(args) -> dict:
    tmp = RESULTS / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    checkpoint = make_checkpoint(args.size, tmp / f"bench-{args.size}")
    from chattts_runtime.model.config import load_model_sizes

    g = load_model_sizes(checkpoint).gpt
    levels = [int(c) for c in args.concurrency.split(",")]
    log = tmp / f"bench-server-{args.device}-{args.engine}.log"
    proc, url = start_server(checkpoint, args.device, args.frames, max(levels), args.chunk_frames, log,
                             engine=args.engine, max_model_len=args.max_model_len)
    texts = [f"benchmark sentence {i}: the quick brown fox jumps over the lazy dog." for i in range(64)]
    try:
        t0 = time.perf_counter()
        await wait_ready(url, proc)
        startup = time.perf_counter() - t0
        sequential = await run_level(url, 1, args.sequential, texts)
        results = []
        for c in levels:
            rounds = max(1, args.rounds if c > 1 else args.rounds)
            row = await run_level(url, c, rounds, texts)
            results.append(row)
            print(f"concurrency {c}: {row['throughput_audio_s_per_s']:.2f} audio s/s, "
                  f"ttfa p50 {row['ttfa_p50_s']:.3f} p99 {row['ttfa_p99_s']:.3f}, rtf p50 {row['rtf_p50']:.3f}, "
                  f"batch {row['mean_batch_size']}", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python -m bench.runtime " + " ".join(sys.argv[1:]),
        "params": {"size": args.size, "frames": args.frames, "sequential": args.sequential, "rounds": args.rounds,
                   "chunk_frames": args.chunk_frames, "engine": args.engine,
                   "max_model_len": args.max_model_len, "dtype": "bfloat16" if args.device == "cuda" else "float32",
                   "model": f"GPT hidden {g.hidden_size}, {g.num_hidden_layers} layers, {g.num_attention_heads} heads"},
        "environment": environment(args.device),
        "server_startup_s": startup,
        "sequential": sequential,
        "levels": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--size", default="small", choices=("tiny", "small", "full"))
    p.add_argument("--frames", type=int, default=64, help="frames per request (21.3 ms of audio each)")
    p.add_argument("--concurrency", default="2,4,8,16")
    p.add_argument("--sequential", type=int, default=8, help="requests in the one-at-a-time baseline")
    p.add_argument("--rounds", type=int, default=2, help="requests per client at each concurrency level")
    p.add_argument("--chunk-frames", type=int, default=24, help="frames per streamed audio chunk")
    p.add_argument("--engine", default="reference", choices=("reference", "graph"),
                   help="runtime engine_kind to serve with (graph: engines/graph.py)")
    p.add_argument("--max-model-len", type=int, default=4096, help="engine.max_model_len (KV cache length)")
    p.add_argument("--tag", default=None, help="file name tag (default: <device>-<date>)")
    args = p.parse_args(argv)
    report = asyncio.run(main_async(args))
    stem = f"runtime-{args.tag or (('h200' if 'H200' in report['environment'].get('gpu', '') else args.device) + '-' + dt.date.today().isoformat())}"
    jpath, mpath = write_report(report, stem)
    print(mpath.read_text())
    print(f"wrote {jpath} and {mpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
