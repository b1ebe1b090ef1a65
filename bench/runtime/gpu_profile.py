"""Where the engine's GPU time goes under load: short ``torch.profiler`` windows inside the engine process.

``bench/runtime/h200.sh --gpu-profile STEP`` puts ``gpu_profile_hook`` first on PYTHONPATH with
``GPU_PROFILE_DIR`` set; every Python process the step starts then runs :func:`start_from_env`, and the one
named ``GPU_PROFILE_PROCESS`` (default: the graph engine's process, ``chattts-graph-engine``) records the
GPU's activity (kernels, copies) for ``GPU_PROFILE_WINDOW_S`` seconds every ``GPU_PROFILE_EVERY_S``, after
``GPU_PROFILE_DELAY_S``; the first window's trace is kept (gzip), and every ``GPU_PROFILE_KEEP_EVERY``-th
with that set. Each window becomes one JSON summary (:func:`summarize_trace`): how much of the
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
    each stream's busy share, time by kernel family and the ``top`` kernels by total time. With no GPU
    events (a CPU machine), the CPU operators are summarized the same way."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    device = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    kind = "gpu"
    if not device:
        device = [e for e in events if e.get("cat") == "cpu_op"]
        kind = "cpu_op"
    window_us = window_s * 1e6
    spans = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in device]
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
        "events": kind, "window_s": round(window_s, 3), "count": len(device),
        "busy_share": round(busy / window_us, 4) if window_us else None,
        "busy_ms": round(busy / 1e3, 2),
        "streams": {s: {"busy_share": round(_union_us(v) / window_us, 4), "count": len(v)}
                    for s, v in sorted(by_stream.items(), key=lambda kv: -len(kv[1]))},
        "families_ms": {f: round(us / 1e3, 2) for f, us in sorted(by_family.items(), key=lambda kv: -kv[1])},
        "top": [{"name": name, "count": n, "total_ms": round(us / 1e3, 3), "mean_us": round(us / n, 1)}
                for name, (n, us) in kernels],
    }


def profile_window(window_s: float, out: Path, index: int, keep_trace: bool) -> dict:
    import torch  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with profile(activities=activities) as prof:
        time.sleep(window_s)
    trace_path = out / f"trace-{os.getpid()}-{index}.json"
    prof.export_chrome_trace(str(trace_path))
    with open(trace_path) as f:
        summary = summarize_trace(json.load(f), window_s)
    summary.update({"pid": os.getpid(), "index": index, "started": round(started, 3)})
    if keep_trace:
        import gzip  # noqa: PLC0415
        import shutil  # noqa: PLC0415

        with open(trace_path, "rb") as src, gzip.open(str(trace_path) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    trace_path.unlink()
    (out / f"gpu-profile-{os.getpid()}-{index}.json").write_text(json.dumps(summary, indent=1))
    return summary


def _run(out: Path, process_name: str, delay: float, every: float, window: float, count: int,
         keep_every: int) -> None:
    import multiprocessing  # noqa: PLC0415

    time.sleep(delay)  # the spawned process has its name by now, and the engine is loaded
    if multiprocessing.current_process().name != process_name:
        return
    for index in range(count):
        started = time.monotonic()
        try:
            summary = profile_window(window, out, index, keep_trace=index == 0 or (keep_every > 0 and index % keep_every == 0))
            print(f"gpu profile {index}: busy {summary['busy_share']}", flush=True)
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
        float(os.environ.get("GPU_PROFILE_WINDOW_S", "1.5")), int(os.environ.get("GPU_PROFILE_COUNT", "30")),
        int(os.environ.get("GPU_PROFILE_KEEP_EVERY", "0") or 0)))
    thread.start()
    return thread
