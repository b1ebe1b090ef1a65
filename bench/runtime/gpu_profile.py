"""Where the engine's GPU time goes under load: short ``torch.profiler`` windows inside the engine process.

``bench/runtime/h200.sh --gpu-profile STEP`` puts ``gpu_profile_hook`` first on PYTHONPATH with
``GPU_PROFILE_DIR`` set; every Python process the step starts then runs :func:`start_from_env`, and the one
named ``GPU_PROFILE_PROCESS`` (default: the graph engine's process, ``chattts-graph-engine``) records the
GPU's activity (kernels, copies) for ``GPU_PROFILE_WINDOW_S`` seconds every ``GPU_PROFILE_EVERY_S``, after
``GPU_PROFILE_DELAY_S``, each into a trace file. After the step, ``python -m bench.runtime.gpu_profile DIR``
turns each trace into one JSON summary (:func:`summarize_dir`, :func:`summarize_trace`): how much of the
window the GPU was busy (the union of its kernels and copies over all streams), per stream, and the kernels
that took the time, grouped by family. On a machine without CUDA the CPU's operators are recorded instead,
so the CPU smoke tier runs the same code.

Why: the loop report says how often the engine waits for the GPU; this says whether the GPU was idle
meanwhile (the host is the limit) or full, and with what (the decode step, the audio decoders, prefills).
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

# Families of kernel names, first match wins (lower-case substrings).
FAMILIES = (
    ("copy", ("memcpy", "memset")),
    ("attention", ("attention", "flash", "fmha", "sdpa")),
    ("convolution", ("conv", "cudnn", "winograd", "implicit_gemm")),
    # float32 products on CUDA cores (no tensor cores): the audio decoders' linear layers in float32
    ("matmul_fp32", ("sgemm", "f32f32_f32f32", "simt")),
    ("matmul", ("gemm", "cutlass", "sm90_", "sm100_", "cublas", "matmul", "nvjet")),
    ("triton", ("triton",)),
    ("reduction", ("reduce", "softmax", "norm", "topk", "sort", "scan", "cumsum")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "index", "gather", "scatter", "where", "copy")),
)
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def family_of(name: str) -> str:
    low = name.lower()
    for family, needles in FAMILIES:
        if any(n in low for n in needles):
            return family
    return "other"


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarize_trace(trace: dict, window_s: float, top: int = 25) -> dict:
    """A Chrome trace (``export_chrome_trace``) of one window as: busy share of the GPU (union over streams),
    each stream's busy share, time by kernel family and the ``top`` kernels by total time. Shares are of the
    window, or of the recorded work's span where that is longer (work queued before the window opened is
    recorded too). With no GPU events (a CPU machine), the CPU operators are summarized the same way."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    device = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    kind = "gpu"
    if not device:
        device = [e for e in events if e.get("cat") == "cpu_op"]
        kind = "cpu_op"
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device]
    span_us = max(end for _, end in spans) - min(start for start, _ in spans) if spans else 0.0
    window_us = max(window_s * 1e6, span_us)
    by_stream: dict[str, list[tuple[float, float]]] = {}
    by_family: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e, span in zip(device, spans):
        stream = str(e.get("args", {}).get("stream", e.get("tid", "?")))
        by_stream.setdefault(stream, []).append(span)
        dur = float(e["dur"])
        family = family_of(e.get("name", ""))
        by_family[family] = by_family.get(family, 0.0) + dur
        entry = by_name.setdefault(e.get("name", "")[:160], [0, 0.0])
        entry[0] += 1
        entry[1] += dur
    busy = _union_us(spans)
    kernels = sorted(by_name.items(), key=lambda item: -item[1][1])[:top]
    return {
        "events": kind, "window_s": round(window_s, 3), "span_ms": round(span_us / 1e3, 2), "count": len(device),
        "busy_share": round(busy / window_us, 4) if window_us else None,
        "busy_ms": round(busy / 1e3, 2),
        "streams": {s: {"busy_share": round(_union_us(v) / window_us, 4), "count": len(v)}
                    for s, v in sorted(by_stream.items(), key=lambda kv: -len(kv[1]))},
        "families_ms": {f: round(us / 1e3, 2) for f, us in sorted(by_family.items(), key=lambda kv: -kv[1])},
        "top": [{"name": name, "count": n, "total_ms": round(us / 1e3, 3), "mean_us": round(us / n, 1)}
                for name, (n, us) in kernels],
    }


def profile_window(window_s: float, out: Path, index: int) -> Path:
    """Record the GPU's work (the CPU's operators without CUDA) for ``window_s`` seconds into
    ``trace-PID-INDEX.json``, and its time and length into ``window-PID-INDEX.json``; summarized later,
    outside this process (:func:`summarize_dir`): reading a trace of a busy second holds the interpreter
    lock for seconds, which would slow the engine it watches."""
    import torch  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with profile(activities=activities) as prof:
        time.sleep(window_s)
    trace_path = out / f"trace-{os.getpid()}-{index}.json"
    prof.export_chrome_trace(str(trace_path))  # written by the profiler's C++ side
    meta = {"pid": os.getpid(), "index": index, "started": round(started, 3), "window_s": window_s}
    _meta_path(trace_path).write_text(json.dumps(meta))
    return trace_path


def _meta_path(trace_path: Path) -> Path:
    return trace_path.with_name(trace_path.name.replace("trace-", "window-", 1))


def summarize_dir(directory: Path, keep_every: int = 0) -> list[dict]:
    """Each window's trace in ``directory`` as ``gpu-profile-PID-INDEX.json`` (:func:`summarize_trace` and
    the window's meta); the trace itself is kept gzipped for the first window of each process and every
    ``keep_every``-th, else removed. A trace cut short (its step was stopped while writing it) is reported
    and removed. Returns the summaries in (pid, index) order."""
    import gzip  # noqa: PLC0415

    summaries = []
    traces = sorted(directory.glob("trace-*-*.json"), key=lambda p: [int(n) for n in p.stem.split("-")[1:3]])
    for trace_path in traces:
        meta_path = _meta_path(trace_path)
        trace_bytes = trace_path.read_bytes()
        try:
            meta = json.loads(meta_path.read_text())
            trace = json.loads(trace_bytes)
        except (OSError, ValueError) as err:
            print(f"{trace_path.name}: not summarized ({err})", flush=True)
            trace_path.unlink()
            meta_path.unlink(missing_ok=True)
            continue
        summary = summarize_trace(trace, meta["window_s"])
        summary.update(meta)
        (directory / f"gpu-profile-{meta['pid']}-{meta['index']}.json").write_text(json.dumps(summary, indent=1))
        if meta["index"] == 0 or (keep_every > 0 and meta["index"] % keep_every == 0):
            with gzip.open(str(trace_path) + ".gz", "wb") as packed:
                packed.write(trace_bytes)
        trace_path.unlink()
        meta_path.unlink()
        summaries.append(summary)
    return summaries


def _run(out: Path, process_name: str, delay: float, every: float, window: float, count: int) -> None:
    import multiprocessing  # noqa: PLC0415

    time.sleep(delay)  # the spawned process has its name by now, and the engine is loaded
    if multiprocessing.current_process().name != process_name:
        return
    for index in range(count):
        started = time.monotonic()
        try:
            profile_window(window, out, index)
            print(f"gpu profile {index}: recorded", flush=True)
        except Exception as err:  # noqa: BLE001  (a profiling aid never stops what it watches)
            print(f"gpu profile window {index} failed: {err!r}", flush=True)
            return
        time.sleep(max(0.0, every - (time.monotonic() - started)))


def start_from_env() -> threading.Thread | None:
    """Start the profiling thread when ``GPU_PROFILE_DIR`` is set (see the module docstring)."""
    out = os.environ.get("GPU_PROFILE_DIR")
    if not out:
        return None
    thread = threading.Thread(target=_run, name="gpu-profile", daemon=True, args=(
        Path(out), os.environ.get("GPU_PROFILE_PROCESS", "chattts-graph-engine"),
        float(os.environ.get("GPU_PROFILE_DELAY_S", "30")), float(os.environ.get("GPU_PROFILE_EVERY_S", "10")),
        float(os.environ.get("GPU_PROFILE_WINDOW_S", "0.5")), int(os.environ.get("GPU_PROFILE_COUNT", "30"))))
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415

    p = argparse.ArgumentParser(description="Summarize the GPU profile windows of one benchmark step.")
    p.add_argument("directory", type=Path)
    p.add_argument("--keep-every", type=int, default=0, help="keep every n-th window's trace (gzip); 0: the first")
    args = p.parse_args(argv)
    for summary in summarize_dir(args.directory, args.keep_every):
        families = ", ".join(f"{name} {ms}" for name, ms in list(summary["families_ms"].items())[:6])
        streams = ", ".join(f"{name} {v['busy_share']}" for name, v in summary["streams"].items())
        print(f"window {summary['pid']}-{summary['index']} at {summary['started']}: busy {summary['busy_share']} "
              f"(streams: {streams}); ms by family: {families}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
