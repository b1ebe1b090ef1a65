"""Runtime benchmark: the speech API under rising concurrency vs one-at-a-time generation.

    python -m bench.runtime                      # CPU, small model (~3 minutes here)
    python -m bench.runtime --device cuda --size full --concurrency 1,16,64,256

What it does, all in one run and against one server process:

1. writes a random checkpoint of the chosen size (official layout; ``endless`` so every
   request yields exactly ``--frames`` frames) under ``bench/results/tmp/``;
2. starts ``chattts-runtime serve`` (reference engine, streaming PCM) on loopback;
3. baseline: ``--sequential`` requests one after another (no overlap, batch size 1);
4. for each concurrency C: C closed-loop clients, each sending requests back to back
   for ``--rounds`` rounds, spread over ``--client-procs`` load generator processes
   (``bench/runtime/loadgen.py``: default one per 32 clients, at most 8) released together;
5. records per request the time to first audio (first PCM bytes), the real-time factor
   (request wall time / audio duration) and, per level, throughput (audio seconds
   produced per wall second) and its ratio to the sequential baseline; plus the
   server's own ``vllm:scheduler_deadline_wait_seconds`` and mean batch size, and the CPU
   use of the load generator's processes and of the server (to show neither side's Python
   was the limit).

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
import subprocess
import sys
import time
from pathlib import Path

from chattts_runtime import metric_names

from bench.runtime import launch, loadgen
from bench.runtime.launch import free_port, log_tail, wait_ready  # noqa: F401  (imported from here by other benches)

REPO = Path(__file__).resolve().parents[2]
# BENCH_RESULTS: another folder for the results and the servers' scratch (the CPU smoke tier's).
RESULTS = Path(os.environ.get("BENCH_RESULTS") or REPO / "bench" / "results")
SAMPLE_RATE = loadgen.SAMPLE_RATE

SIZES = {
    # name: (hidden, layers, heads)
    "tiny": (64, 2, 2),
    "small": (256, 6, 8),
}


percentile = loadgen.percentile  # engine_load and graph_check import it from here

# The engine loop's too-wide account (engines.slots.TOO_WIDE_NAMES, and older revisions' names) as the table says them.
TOO_WIDE_LABELS = {"urgent_rows": "their rows", "substep_batch": "substep bucket", "full_batch": "full bucket",
                   "urgent_span": "span", "urgent_above_low": "above the low slots"}


def make_checkpoint(size: str, path: Path) -> Path:
    from chattts_runtime import testing

    if (path / "asset" / "gpt" / "config.json").exists():
        return path
    sizes = testing.full_sizes() if size == "full" else testing.tiny_sizes(*SIZES[size])
    return testing.make_checkpoint(path, sizes, seed=0, endless=True)


# The requests every runtime benchmark sends (distinct texts, similar prompt lengths).
BENCH_TEXTS = [f"benchmark sentence {i}: the quick brown fox jumps over the lazy dog." for i in range(64)]

# --mixed: one sentence to a paragraph (1 to 4 sentences), each request's audio sized to its text.
MIXED_SENTENCES = [
    "the committee met on tuesday to review the budget for the coming year.",
    "after a long discussion they agreed to fund the new library on the east side of town.",
    "construction is expected to start in the spring, weather permitting.",
    "residents who want to comment can write to the council before the end of the month.",
    "the mayor thanked everyone who took part and promised regular updates.",
    "a public meeting will be held in the old school hall next thursday evening.",
]
VOICE_CHOICES = {"default": None, "on": True, "off": False, "stream": "stream"}
FRAMES_PER_WORD = 16  # ~0.34 s of speech per word (2.9 words/s)
REFINE_TOKENS_PER_WORD = 1.5  # refine rewrites the text with a few prosody tokens added


def mixed_requests(count: int = 64) -> list[dict]:
    """Request bodies of 1..4 sentences, cycling, each sized to its text.

    The random checkpoint never ends by itself, so ``max_new_tokens`` is the length it speaks and
    ``refine_max_new_tokens`` the length refine-text writes (upstream's ``RefineTextParams.max_new_token``).
    Both apply to each piece of a long input (upstream's params apply to every text of its batch), and
    upstream cuts a paragraph into its sentences: so they are sized to the request's longest sentence,
    which is what a real checkpoint speaks for each piece, not to the whole paragraph (sized to the
    paragraph, every piece of a four-sentence request spoke four sentences' worth and refined four
    sentences' worth of tokens, and the first-piece voice pass ran ~900 frames instead of ~250)."""
    out = []
    for i in range(count):
        n = 1 + i % 4  # one sentence to a paragraph of four
        first = i % len(MIXED_SENTENCES)
        chosen = [MIXED_SENTENCES[(first + k) % len(MIXED_SENTENCES)] for k in range(n)]
        chosen[0] = f"item {i}: " + chosen[0]
        longest = max(len(sentence.split()) for sentence in chosen)
        out.append({"input": " ".join(chosen), "max_new_tokens": FRAMES_PER_WORD * longest,
                    "refine_max_new_tokens": int(REFINE_TOKENS_PER_WORD * longest) + 4})
    return out


def engine_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--engine-setting``: the value read as YAML (numbers, booleans, null, strings)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def bench_checkpoint(size: str):
    """The benchmark's random checkpoint of ``size`` under bench/results/tmp, and its GPT sizes."""
    from chattts_runtime.model.config import load_model_sizes

    tmp = RESULTS / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    checkpoint = make_checkpoint(size, tmp / f"bench-{size}")
    return checkpoint, load_model_sizes(checkpoint).gpt


def server_settings(checkpoint: Path, device: str, frames: int, max_seqs: int, chunk: int, *,
                    engine: str = "reference", max_model_len: int = 4096, refine: bool = False,
                    audio_decoder: str = "dvae", voice_from_first_piece: bool | str | None = None,
                    vllm: dict | None = None, engine_overrides: dict | None = None) -> dict:
    """The benchmark server's runtime config (the YAML's shape; ``launch`` validates it). ``None`` leaves a
    field at the runtime's default (it is then not written at all)."""
    text = {"frames_per_text_token": 4.0}
    # The random checkpoint's test tokenizer spells words out (~4.5 tokens a word, a real one ~1.3): the
    # front-end's frame budget per token is scaled so a paragraph stays one piece, as it would be.
    if voice_from_first_piece is not None:
        text["voice_from_first_piece"] = voice_from_first_piece
    engine_settings = {"max_num_seqs": max_seqs, "max_model_len": max_model_len}
    if engine == "graph":  # its loop account (engine_loop): a GPU level runs for tens of seconds, a CPU one for a few
        engine_settings["loop_report_seconds"] = 2.0 if device == "cuda" else 0.25
    if engine == "vllm":  # its own knobs (``vllm``: enforce_eager, enable_prefix_caching, kv_cache_dtype, ...)
        engine_settings.update({"dtype": "bfloat16" if device == "cuda" else "float32", **(vllm or {})})
    settings = {
        "model": {"path": str(checkpoint)}, "engine_kind": engine, "device": device,
        "engine": engine_settings,
        "server": {"max_queue": 4096},
        "text": text,
        "generation": {"temperature": 0.3, "seed": 0, "max_new_frames": frames, "stream_chunk_frames": chunk,
                       "refine_text": refine, "audio_decoder": audio_decoder},
    }
    # --engine-setting, checked by the runtime's config model: KEY is engine.KEY, SECTION.KEY that section's.
    for key, value in (engine_overrides or {}).items():
        section, _, field = key.rpartition(".")
        settings.setdefault(section or "engine", {})[field] = value
    return settings


def start_server(checkpoint: Path, device: str, frames: int, max_seqs: int, chunk: int, log: Path,
                 runtime: Path | None = None, **options):
    """``launch.start`` of ``server_settings``: (process, url)."""
    server = launch.start(server_settings(checkpoint, device, frames, max_seqs, chunk, **options), log,
                          runtime=runtime)
    return server.proc, server.url


async def scrape(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    async with httpx.AsyncClient(base_url=url, timeout=30) as fresh:  # no stale keep-alive connection
        text = (await fresh.get("/metrics")).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in (f"{metric_names.SCHEDULER_DEADLINE_WAIT}_sum", f"{metric_names.SCHEDULER_DEADLINE_WAIT}_count",
                          "chattts_batch_size_sum", "chattts_batch_size_count",
                          "chattts_event_loop_lag_seconds_sum", "chattts_event_loop_lag_seconds_count",
                          metric_names.REQUESTS_RUNNING, metric_names.REQUESTS_WAITING):
                out[s.name] = s.value
    return out


OCCUPANCY_EVERY_S = 0.25  # how often a level's engine occupancy is sampled from the server's gauges


async def sample_occupancy(url: str, stop: asyncio.Event) -> list[tuple[float, float, float]]:
    """``(time.monotonic(), requests running, requests waiting)`` from the server's gauges, every
    ``OCCUPANCY_EVERY_S`` until ``stop``; a failed scrape is skipped (the level's own checks report it)."""
    samples = []
    while not stop.is_set():
        try:
            got = await scrape(url)
            samples.append((time.monotonic(), got.get(metric_names.REQUESTS_RUNNING, 0.0),
                            got.get(metric_names.REQUESTS_WAITING, 0.0)))
        except Exception:  # noqa: BLE001  (a sample, not a measurement: the next one may answer)
            pass
        try:
            await asyncio.wait_for(stop.wait(), OCCUPANCY_EVERY_S)
        except asyncio.TimeoutError:
            pass
    return samples


def occupancy(samples: list[tuple[float, float, float]], streams: int,
              window: tuple[float, float] | None) -> dict | None:
    """Where a level's ``streams`` were on average: audio requests running in the engine (a slot each; a
    voice pass is one, and a long input's next piece run ahead is a second), responses waiting (in the
    engine's queue, or in refine-text), and the streams with neither (the voice encode, hand-offs between
    pieces, a response's last audio, the client between requests; a lower bound, as a response may run
    two pieces). Over the samples inside ``window`` (the steady window), else over all; None without any."""
    chosen, scope = steady_or_level(samples, [s for s in samples if window and window[0] <= s[0] <= window[1]])
    if not chosen:
        return None
    running = sum(s[1] for s in chosen) / len(chosen)
    waiting = sum(s[2] for s in chosen) / len(chosen)
    return {"samples": len(chosen), "scope": scope, "running": round(running, 1),
            "waiting": round(waiting, 1), "neither": round(max(0.0, streams - running - waiting), 1)}


def steady_or_level(items: list, steady: list) -> tuple[list, str]:
    """A level's account is taken over the ``steady`` ones of its ``items`` (those of its steady window) when
    there are any, else over all of them, ramps included: the items taken, and which of the two it was."""
    return (steady, "steady window") if steady else (items, "level")


LOOP_MARK = "engine loop: "  # the graph engine's periodic account (engines.slots.LoopStats), one JSON per line


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def engine_loop(log: Path, offset: int, window: tuple[float, float] | None = None) -> tuple[dict | None, int]:
    """The graph engine's loop reports logged since byte ``offset`` of the server's ``log``, merged
    (``merge_loop_reports``), and the log's new end; None when none were logged. With ``window`` (the
    level's steady window on ``time.monotonic``), only the reports that lie mostly inside it
    (``in_window``), when there are any: the ramps at a level's start and end carry fewer rows."""
    try:
        with log.open("rb") as fh:
            fh.seek(offset)
            text = fh.read()
    except OSError:
        return None, offset
    reports = []
    for line in text.decode("utf-8", "replace").splitlines():
        if LOOP_MARK in line:
            try:
                reports.append(json.loads(line.split(LOOP_MARK, 1)[1]))
            except ValueError:
                continue
    if not reports:
        return None, offset + len(text)
    chosen, scope = steady_or_level(reports, in_window(reports, window) if window else [])
    merged = merge_loop_reports(chosen)
    merged["scope"] = scope
    return merged, offset + len(text)


def in_window(reports: list[dict], window: tuple[float, float]) -> list[dict]:
    """The reports whose middle falls inside ``window`` (``[start, end]`` on the engine's clock); none from a
    revision whose reports do not say when they were taken."""
    start, end = window
    return [r for r in reports if "began_at" in r and start <= (r["began_at"] + r["ended_at"]) / 2 <= end]


# What each mean of a loop report is a mean over (engines.slots.LoopStats.report), as a count of the report
# from its rate: a report with no too-wide step says 0 rows for them, which must not pull the merged mean
# down. Figures not named here are per second of work (or a share of it): weighted by the work's seconds.
LOOP_MEAN_OVER = {"rows_per_step": "steps_per_s", "idle_rows_per_step": "steps_per_s",
                  "kv_positions_per_step": "steps_per_s", "length_bucket_per_step": "steps_per_s",
                  "rows_per_prefill": "prefills_per_s", "rows_per_audio_launch": "audio_launches_per_s",
                  "too_wide": "substeps_too_wide_per_s", "free_slots_per_step": "steps_per_s",
                  "draining_slots_per_step": "steps_per_s", "audio_lag_ms": "audio_windows_out_per_s"}
# Figures that are the most over a report, merged as the most over all of them.
LOOP_MAX = {"audio_lag_max_ms"}


def steady_span(row: dict) -> tuple[float, float] | None:
    """A summarized level's steady window (``loadgen.steady_window``, kept by ``loadgen.summarize``) as
    ``(start, end)`` on ``time.monotonic``; None when it has none."""
    start, end = row.get("steady_began_at"), row.get("steady_ended_at")
    return (start, end) if start is not None and end is not None and end > start else None


def merge_loop_reports(reports: list[dict]) -> dict:
    """Several loop reports as one: rates and shares weighted by each report's seconds of work, means by
    the count they are a mean over (``LOOP_MEAN_OVER``), maxima as the largest (``LOOP_MAX``); a mean over
    nothing is 0."""
    def weight(report: dict, key: str) -> float:
        over = LOOP_MEAN_OVER.get(key)
        return report["wall_s"] * (report.get(over, 0.0) if over else 1.0)

    def mean(key: str, values: list[float]) -> float:
        weights = [weight(r, key) for r in reports]
        total = sum(weights)
        return round(sum(v * w for v, w in zip(values, weights)) / total, 3) if total else 0.0

    merged = {"reports": len(reports), "wall_s": round(sum(r["wall_s"] for r in reports), 1)}
    if all("began_at" in r for r in reports):  # the span they cover, not a mean of clock readings
        merged["began_at"] = min(r["began_at"] for r in reports)
        merged["ended_at"] = max(r["ended_at"] for r in reports)
    for key, value in reports[0].items():
        if key in ("began_at", "ended_at"):
            continue
        if key in LOOP_MAX:
            merged[key] = max(r[key] for r in reports)
        elif isinstance(value, dict):
            merged[key] = {name: mean(key, [r[key][name] for r in reports]) for name in value}
        elif key != "wall_s":
            merged[key] = mean(key, [r[key] for r in reports])
    if all(r.get("busy_share") for r in reports):  # work over elapsed time, both summed
        merged["busy_share"] = round(sum(r["wall_s"] for r in reports)
                                     / sum(r["wall_s"] / r["busy_share"] for r in reports), 3)
    return merged


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process and its threads so far (Linux /proc), or None where unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command name: state is field 3, utime and stime are fields 14 and 15 (clock ticks).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_level(url: str, concurrency: int, requests_per_client: int, texts: list[str], *,
                    server_pid: int | None = None, client_procs: int | None = None,
                    client_lib: str = "auto", stagger_s: float = 0.0) -> dict:
    """One level through the multi-process load generator, with the server's metrics and CPU use around it."""
    before = await scrape(url)
    server_cpu: list[float | None] = []

    def sample_server_cpu() -> None:
        server_cpu.append(process_cpu_seconds(server_pid) if server_pid else None)

    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_occupancy(url, stop))
    try:
        row = await asyncio.to_thread(loadgen.run_level, url, concurrency, requests_per_client, texts,
                                      client_procs, client_lib, sample_server_cpu, sample_server_cpu, stagger_s)
    finally:
        stop.set()
        samples = await sampler
    row["occupancy"] = occupancy(samples, concurrency, steady_span(row))
    after = await scrape(url)
    cpu0, cpu1 = server_cpu

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    waits = delta(f"{metric_names.SCHEDULER_DEADLINE_WAIT}_count")
    steps = delta("chattts_batch_size_count")
    row["server_cpu_cores"] = (cpu1 - cpu0) / row["wall_s"] if cpu0 is not None and cpu1 is not None else None
    row["deadline_wait_mean_s"] = delta(f"{metric_names.SCHEDULER_DEADLINE_WAIT}_sum") / waits if waits else None
    row["mean_batch_size"] = delta("chattts_batch_size_sum") / steps if steps else None
    row["engine_steps_per_s"] = steps / row["wall_s"] if row["wall_s"] else None  # 1 / (a step's wall time)
    lags = delta("chattts_event_loop_lag_seconds_count")  # the speech server's loop: late by this much per timer
    row["loop_lag_mean_s"] = delta("chattts_event_loop_lag_seconds_sum") / lags if lags else None
    return row


def importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def environment(device: str, client_lib: str) -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "device": device}
    if device == "cuda" and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    # The server runs under this interpreter: uvicorn picks httptools and uvloop when they import.
    info["server_http"] = "httptools" if importable("httptools") else "h11"
    info["server_loop"] = "uvloop" if importable("uvloop") else "asyncio"
    info["client_lib"] = client_lib
    info["client_loop"] = "uvloop" if importable("uvloop") else "asyncio"
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
        + (f"mixed lengths (1 to 4 sentences, {FRAMES_PER_WORD} frames per word, at most {p['frames']}), "
           if p.get("mixed") else f"{p['frames']} frames per request ({p['frames'] * 512 / SAMPLE_RATE:.2f} s of audio), ")
        + (f"vLLM settings {json.dumps(p['vllm'], sort_keys=True)}, " if p.get("vllm") else "")
        + f"refine-text {'on' if p.get('refine_text') else 'off'}, audio path {p.get('audio_decoder', 'dvae')}, "
        f"streaming PCM "
        f"through the speech API, sampling (temperature 0.3). Environment: "
        f"{json.dumps(report['environment'])}.",
        "",
        "| mode | concurrency | requests (steady) | steady window (s) | throughput (audio s / s) | vs sequential "
        "| TTFA p50 (s) | TTFA p99 (s) "
        "| RTF p50 | RTF p99 | deadline wait mean (s) | mean batch | client procs | client CPU busiest proc "
        "| client CPU all (cores) | server CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = report["sequential"]["throughput_audio_s_per_s"]
    for row in [report["sequential"], *report["levels"]]:
        mode = "sequential (baseline)" if row is report["sequential"] else "concurrent"
        lines.append(
            f"| {mode} | {row['concurrency']} | {row['requests']} ({row.get('steady_requests', row['requests'])}) "
            f"| {row.get('steady_window_s', row['wall_s']):.2f} | {row['throughput_audio_s_per_s']:.2f} "
            f"| {row['throughput_audio_s_per_s'] / base:.2f}x | {row['ttfa_p50_s']:.3f} | {row['ttfa_p99_s']:.3f} "
            f"| {row['rtf_p50']:.3f} | {row['rtf_p99']:.3f} | "
            f"{row['deadline_wait_mean_s'] if row['deadline_wait_mean_s'] is None else round(row['deadline_wait_mean_s'], 4)} "
            f"| {row['mean_batch_size'] if row['mean_batch_size'] is None else round(row['mean_batch_size'], 2)} "
            f"| {row['client_procs']} | {row['loadgen_cpu_max_proc']:.2f} | {row['loadgen_cpu_cores']:.2f} "
            f"| {'n/a' if row['server_cpu_cores'] is None else format(row['server_cpu_cores'], '.2f')} |")
    lines += ["", "| concurrency | class | requests | TTFA p50 (s) | TTFA p99 (s) |", "|---|---|---|---|---|"]
    for row in [report["sequential"], *report["levels"]]:
        for name, c in row.get("ttfa_by_class", {}).items():
            lines.append(f"| {row['concurrency']} | {name} | {c['requests']} | {c['ttfa_p50_s']:.3f} "
                         f"| {c['ttfa_p99_s']:.3f} |")
    occupied = [row for row in [report["sequential"], *report["levels"]] if row.get("occupancy")]
    if occupied:
        lines += ["", "| concurrency | audio requests running (mean) | waiting | neither | samples (over) |",
                  "|---|---|---|---|---|"]
        for row in occupied:
            occ = row["occupancy"]
            lines.append(f"| {row['concurrency']} | {occ['running']:.1f} | {occ['waiting']:.1f} | {occ['neither']:.1f} "
                         f"| {occ['samples']} ({occ['scope']}) |")
        lines += ["", f"Occupancy: the server's `{metric_names.REQUESTS_RUNNING}` and `{metric_names.REQUESTS_WAITING}` "
                  f"gauges sampled every {OCCUPANCY_EVERY_S} s, averaged over the steady window (else the level). "
                  "Running: audio requests holding a slot (a voice pass is one; a long input's next piece run ahead "
                  "is a second). Waiting: responses in the engine's queue or in refine-text. Neither: the streams "
                  "left (the voice encode, hand-offs between pieces, a response's last audio, the client between "
                  "requests), at least."]
    lines += ["", "| concurrency | part of the first audio | n | p50 (s) | p99 (s) | mean (s) |",
              "|---|---|---|---|---|---|"]
    for row in [report["sequential"], *report["levels"]]:
        for name, part in row.get("first_audio_parts", {}).items():
            lines.append(f"| {row['concurrency']} | {name} | {part['n']} | {part['p50_s']:.3f} | {part['p99_s']:.3f} "
                         f"| {part['mean_s']:.3f} |")
    lines += ["", "Parts: refine and voice (the first-piece voice pass: generation, decode, encode) are the "
              "server's own timings (Server-Timing), before the response starts; after_headers is the client's "
              "time from the response's headers to its first audio (the first piece's queue wait, prefill and "
              "first window). One-piece / multi-piece: the input's pieces (X-ChatTTS-Pieces)."]
    loops = [row for row in [report["sequential"], *report["levels"]] if row.get("engine_loop")]
    if loops:  # the graph engine's own account of each level (engines.slots.LoopStats)
        # Labels by the report's own names: an A/B arm of an older revision accounts for too-wide steps otherwise.
        wide_names = next((list(row["engine_loop"]["too_wide"]) for row in loops if row["engine_loop"].get("too_wide")),
                          [])
        wide_labels = " / ".join(TOO_WIDE_LABELS.get(name, name) for name in wide_names) or "-"
        lines += ["", "| concurrency | decode steps/s (first-audio substeps) | rows per step: first / voice / next / "
                  f"refine / idle | substeps too wide/s ({wide_labels}) "
                  "| KV positions of its rows per step (per row; length bucket) "
                  "| prefills/s (rows each) | audio launches/s (rows each) | slots free / draining "
                  "| audio lag ms: mean (max) | GPU wait share | over |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in loops:
            loop = row["engine_loop"]
            rows = " / ".join(f"{v:.1f}" for v in [*loop["rows_per_step"].values(), loop["idle_rows_per_step"]])
            wide = " / ".join(f"{v:.1f}" for v in loop.get("too_wide", {}).values()) or "-"
            stepped_rows = sum(loop["rows_per_step"].values())
            kv = (f"{loop['kv_positions_per_step']:,.0f} ({loop['kv_positions_per_step'] / max(stepped_rows, 1e-9):.0f}; "
                  f"{loop['length_bucket_per_step']:.0f})" if "kv_positions_per_step" in loop else "-")
            slots = (f"{loop['free_slots_per_step']:.1f} / {loop['draining_slots_per_step']:.1f}"
                     if "draining_slots_per_step" in loop else "-")  # an A/B arm of an older revision: not counted
            lag = f"{loop['audio_lag_ms']:.1f} ({loop['audio_lag_max_ms']:.1f})" if "audio_lag_ms" in loop else "-"
            lines.append(f"| {row['concurrency']} | {loop['steps_per_s']:.1f} ({loop.get('substeps_per_s', 0):.1f}) "
                         f"| {rows} | {loop.get('substeps_too_wide_per_s', 0):.1f} ({wide}) | {kv} "
                         f"| {loop['prefills_per_s']:.1f} "
                         f"({loop['rows_per_prefill']:.1f}) | {loop['audio_launches_per_s']:.1f} "
                         f"({loop['rows_per_audio_launch']:.1f}) | {slots} | {lag} | {loop['gpu_wait_share']:.2f} "
                         f"| {loop.get('scope', 'level')}, {loop['reports']} reports |")
        lines += ["", "Engine loop: the graph engine's account (`engine.loop_report_seconds`, merged: rates by seconds "
                  "of work, means by what they are means over), over the reports whose middle fell inside the "
                  "level's steady window (else, and for revisions whose reports carry no clock readings, over the "
                  "whole level, ramps included; the last column says which): decode steps per second "
                  "of work (of them, first-audio substeps over the refine rows and voice passes), each "
                  "step's rows by stage and the free rows of its batch bucket, the full steps whose pace allowed "
                  "substeps that did not run because a substep over the first-audio rows would have been over half "
                  "the step's bucket (what those rows were, as means over such steps), the cached positions of a step's "
                  "rows (their contexts, summed: what the ragged attention reads; the padded one, below 128 rows "
                  "on CUDA and always on the CPU, reads rows x bucket) and its KV length bucket, prefills and "
                  "audio-window launches, the slots free and draining at a step (draining: ended, but their last "
                  "audio window is not done, so no newcomer can have them), the lag from the step that made an "
                  "audio window due to its audio handed out (hold, the audio stream's queue, the decode), "
                  "and the share of the worker's time spent waiting for the GPU (near 1: the GPU is the limit, not the host)."]
    lines += ["", "TTFA: request sent -> first PCM bytes. RTF: request wall time / audio duration (< 1 is faster "
              "than real time). Client: closed-loop streaming clients spread over separate processes "
              f"({report['environment']['client_lib']} on {report['environment']['client_loop']}), released "
              "together; at concurrent levels client i starts i/C of a stagger (`--stagger`, 0.5 s) "
              "late, so arrivals come in steady phases rather than one burst of C (every request has the same "
              "length, so a common start would repeat as a burst every round). Steady window: from the last "
              "client's start to the first client's end, when all C clients were in their loops. Throughput: "
              "audio seconds delivered inside the steady window per second of it; percentiles over the requests "
              "that began and ended inside it (all requests when fewer than one per client did). The sequential "
              "baseline runs the same requests one at a time in the same server process, before the concurrent "
              "levels. Client CPU: CPU seconds per wall second, for the busiest client process (1.00 = one core "
              "saturated, the load generator would then be the bottleneck) and for all of "
              "them; server CPU likewise for the server process (all its threads), over the same window."]
    mpath.write_text("\n".join(lines) + "\n")
    return jpath, mpath


async def main_async(args) -> dict:
    checkpoint, g = bench_checkpoint(args.size)
    if args.runtime is not None:  # that revision's own checkpoint layout, same sizes and seed
        checkpoint = launch.checkpoint_for(args.runtime, args.size, SIZES.get(args.size),
                                           RESULTS / "tmp" / f"bench-{args.size}-{args.runtime.parent.name}")
    tmp = RESULTS / "tmp"
    levels = args.concurrency
    client_lib = loadgen.pick_client_lib(args.client_lib)
    log = tmp / f"bench-server-{args.device}-{args.tag or args.engine}.log"
    proc, url = start_server(checkpoint, args.device, args.frames, args.max_num_seqs or max(levels),
                             args.chunk_frames, log, runtime=args.runtime,
                             engine=args.engine, max_model_len=args.max_model_len, refine=args.refine == "on",
                             audio_decoder=args.audio_decoder,
                             voice_from_first_piece=VOICE_CHOICES[args.voice_from_first_piece],
                             engine_overrides=dict(args.engine_setting),
                             **({"vllm": vllm_settings(args)} if args.engine == "vllm" else {}))
    texts = mixed_requests() if args.mixed else BENCH_TEXTS
    try:
        t0 = time.perf_counter()
        await wait_ready(url, proc, log=log)
        startup = time.perf_counter() - t0
        log_offset = log_size(log)  # the loop reports of start-up and warm-up are not the levels'
        sequential = await run_level(url, 1, args.sequential, texts, server_pid=proc.pid, client_procs=1,
                                     client_lib=client_lib)
        sequential["engine_loop"], log_offset = engine_loop(log, log_offset, steady_span(sequential))
        results = []
        for c in levels:
            stagger = args.stagger if c > 1 else 0.0
            row = await run_level(url, c, args.rounds, texts, server_pid=proc.pid, client_procs=args.client_procs,
                                  client_lib=client_lib, stagger_s=stagger)
            row["engine_loop"], log_offset = engine_loop(log, log_offset, steady_span(row))
            results.append(row)
            classes = ", ".join(f"{name} p99 {c['ttfa_p99_s']:.3f}" for name, c in row["ttfa_by_class"].items())
            parts = ", ".join(f"{name} p50 {p['p50_s']:.3f}" for name, p in row["first_audio_parts"].items())
            print(f"concurrency {c}: {row['throughput_audio_s_per_s']:.2f} audio s/s, "
                  f"ttfa p50 {row['ttfa_p50_s']:.3f} p99 {row['ttfa_p99_s']:.3f} ({classes}; {parts}), "
                  f"rtf p50 {row['rtf_p50']:.3f}, steps/s {row['engine_steps_per_s'] or 0:.0f}, "
                  f"loop lag {1e3 * (row['loop_lag_mean_s'] or 0):.1f} ms, "
                  f"batch {row['mean_batch_size']}, loop {json.dumps(row['engine_loop'])}, "
                  f"{row['client_procs']} client procs "
                  f"(busiest {row['loadgen_cpu_max_proc']:.2f} core), server {row['server_cpu_cores'] or float('nan'):.2f} cores",
                  flush=True)
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
                   "chunk_frames": args.chunk_frames, "engine": args.engine, "client_procs": args.client_procs,
                   "max_model_len": args.max_model_len, "dtype": "bfloat16" if args.device == "cuda" else "float32",
                   "refine_text": args.refine == "on", "audio_decoder": args.audio_decoder, "mixed": args.mixed,
                   "voice_from_first_piece": args.voice_from_first_piece,
                   "vllm": vllm_settings(args) if args.engine == "vllm" else None,
                   "max_num_seqs": args.max_num_seqs or max(levels),
                   "engine_settings": dict(args.engine_setting),
                   "runtime": str(args.runtime) if args.runtime else "this tree",
                   "model": f"GPT hidden {g.hidden_size}, {g.num_hidden_layers} layers, {g.num_attention_heads} heads"},
        "environment": environment(args.device, client_lib),
        "server_startup_s": startup,
        "sequential": sequential,
        "levels": results,
    }


def vllm_settings(args) -> dict:
    """The vllm engine's settings from the command line (``server_settings``'s ``vllm``)."""
    out = {"enforce_eager": args.cuda_graphs == "off", "enable_prefix_caching": args.prefix_cache == "on",
           "kv_cache_dtype": args.kv_cache_dtype}
    if args.gpu_memory_utilization is not None:
        out["gpu_memory_utilization"] = args.gpu_memory_utilization
    return out


def positive_int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every level must be >= 1, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.runtime", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--size", default="small", choices=("tiny", "small", "full"))
    p.add_argument("--frames", type=int, default=64, help="frames per request (21.3 ms of audio each)")
    p.add_argument("--concurrency", default=[2, 4, 8, 16], type=positive_int_list,
                   help="comma-separated concurrency levels")
    p.add_argument("--sequential", type=int, default=8, help="requests in the one-at-a-time baseline")
    p.add_argument("--rounds", type=int, default=2, help="requests per client at each concurrency level")
    p.add_argument("--stagger", type=float, default=0.5,
                   help="seconds over which the clients' first requests are spread; throughput and "
                        "percentiles cover the window where all clients run")
    p.add_argument("--chunk-frames", type=int, default=24, help="frames per streamed audio chunk")
    p.add_argument("--engine", default="reference", choices=("reference", "graph", "vllm"),
                   help="runtime engine_kind to serve with (graph: engines/graph.py; vllm: engines/vllm_engine.py, "
                   "vLLM installed beside the runtime)")
    p.add_argument("--cuda-graphs", default="on", choices=("on", "off"),
                   help="vllm engine: off = engine.enforce_eager (no torch.compile, no CUDA graphs)")
    p.add_argument("--prefix-cache", default="off", choices=("on", "off"),
                   help="vllm engine: engine.enable_prefix_caching (prompts salted by speaker)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8"), help="vllm engine: engine.kv_cache_dtype")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="vllm engine: engine.gpu_memory_utilization (default: the runtime's)")
    p.add_argument("--max-model-len", type=int, default=4096, help="engine.max_model_len (KV cache length)")
    p.add_argument("--refine", default="off", choices=("on", "off"), help="generation.refine_text")
    p.add_argument("--voice-from-first-piece", default="default", choices=tuple(VOICE_CHOICES),
                   help="text.voice_from_first_piece: on (upstream's), off, stream (the voice pass streamed as the "
                   "first piece); default: the runtime's default")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="engine.max_num_seqs (default: the highest concurrency level)")
    p.add_argument("--runtime", type=Path, default=None,
                   help="serve this directory's chattts_runtime (another revision's runtime/, for A/B) with this "
                   "tree's client; its config carries only the fields the benchmark sets")
    p.add_argument("--audio-decoder", default="dvae", choices=("dvae", "decoder"), help="generation.audio_decoder")
    p.add_argument("--mixed", action="store_true",
                   help="mixed request lengths (1 to 4 sentences, audio sized to the text) instead of --frames each")
    p.add_argument("--client-procs", type=int, default=None,
                   help="load generator processes per level (default: min(8, ceil(concurrency / 32)))")
    p.add_argument("--client-lib", default="auto", choices=("auto", *loadgen.CLIENT_LIBS),
                   help="HTTP client of the load generator (auto: aiohttp if installed, else httpx)")
    p.add_argument("--tag", default=None, help="file name tag (default: <device>-<date>)")
    p.add_argument("--engine-setting", action="append", default=[], type=engine_setting, metavar="KEY=VALUE",
                   help="one more engine.KEY of the server's config (a YAML value), e.g. first_audio_substeps=0, "
                        "or SECTION.KEY of another section, e.g. generation.stream_max_chunk_frames=96; "
                        "repeatable: an A/B of one setting within one tree")
    args = p.parse_args(argv)
    if args.client_procs is not None and args.client_procs < 1:
        p.error(f"--client-procs must be >= 1, got {args.client_procs}")
    report = asyncio.run(main_async(args))
    stem = f"runtime-{args.tag or (('h200' if 'H200' in report['environment'].get('gpu', '') else args.device) + '-' + dt.date.today().isoformat())}"
    jpath, mpath = write_report(report, stem)
    print(mpath.read_text())
    print(f"wrote {jpath} and {mpath}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
