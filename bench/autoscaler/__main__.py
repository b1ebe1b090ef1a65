"""Autoscaler benchmark: ``python -m bench.autoscaler [--traces diurnal,bursts,ramp] [--out bench/results]``.

Runs the fleet simulation of ``fleet.py`` on seeded traces with the operator's decision
function and the HPA and KEDA baselines, and writes ``autoscaler-results.md`` (table),
``autoscaler-results.json`` (raw figures and calibration) and ``autoscaler-<trace>.png``.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from chattts_operator.api.autoscaling import AutoscalingSpec
from bench.autoscaler import traces as trace_lib
from bench.autoscaler.fleet import FleetModel, flaps, minute_quantiles, reversals, simulate
from bench.autoscaler.policies import Hpa, Keda, Operator

MIN_REPLICAS, MAX_REPLICAS = 1, 16
CALIBRATION = (
    "Step time per batch size: the ChatTTS-shaped GPT decode step on one H200 with CUDA-graph "
    "replay (shared/anchors/README.md: 2.32 ms at batch 1, 2.52 at 16, 2.83 at 64, 3.88 at 256), "
    "times 1.5 for the decoder and vocoder sharing the GPU (an assumption: no runtime GPU "
    "benchmark existed when this ran). Replicas run 16 requests at once (maxNumSeqs 16, a GPU "
    "slice each); requests are paragraphs of speech (log-normal, median 12 s of audio); cold "
    "start 90 s; autoscalers evaluate every 15 s on a 60 s window."
)


def operator_spec() -> AutoscalingSpec:
    # The defaults a user gets, with the same bounds as the baselines.
    return AutoscalingSpec(enabled=True, min_replicas=MIN_REPLICAS, max_replicas=MAX_REPLICAS)


def run_trace(trace, model: FleetModel, seed: int) -> dict:
    spec = operator_spec()
    target = spec.target_seconds
    contenders = [
        Operator(spec),
        Hpa(target, MIN_REPLICAS, MAX_REPLICAS),
        Keda(5.0, MIN_REPLICAS, MAX_REPLICAS),
    ]
    initial = max(MIN_REPLICAS, math.ceil(trace.rate[:60].mean() * 2.3 / 8))
    out = {"trace": trace.name, "title": trace.title, "requests": int(len(trace.arrivals)), "runs": []}
    for contender in contenders:
        started = time.perf_counter()
        result = simulate(model, trace.arrivals, trace.frames, contender, initial, trace.duration, seed)
        per_minute = minute_quantiles(trace.arrivals, result.waits, trace.duration, model.quantile)
        violations = int(np.sum(per_minute > target))
        out["runs"].append({
            "autoscaler": contender.name,
            "slo_violation_minutes": violations,
            "replica_hours": round(result.replica_seconds / 3600.0, 2),
            "reversals": reversals(result.changes),
            "flaps_under_10min": flaps(result.changes),
            "scale_changes": len(result.changes),
            "p99_wait_ms_overall": round(float(np.quantile(result.waits, 0.99)) * 1000, 2),
            "max_replicas": max((r for _, r, _, _ in result.timeline), default=initial),
            "sim_seconds": round(time.perf_counter() - started, 1),
            "_timeline": result.timeline,
            "_per_minute": per_minute,
        })
    return out


def plot(trace, summary: dict, target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = trace.duration / 3600.0
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    minute_rate = trace.rate[: int(trace.duration) // 60 * 60].reshape(-1, 60).mean(axis=1)
    axes[0].plot(np.arange(len(minute_rate)) / 60.0, minute_rate, color="black", lw=1)
    axes[0].set_ylabel("load (req/s)")
    axes[0].set_title(f"{trace.title}: load, replicas, p99 scheduler_deadline_wait per minute")
    colors = {"operator": "tab:green"}
    palette = iter(["tab:blue", "tab:orange"])
    for run in summary["runs"]:
        name = run["autoscaler"]
        color = colors.get(name) or next(palette)
        tl = run["_timeline"]
        t = np.array([x[0] for x in tl]) / 3600.0
        label = (f"{name}: {run['slo_violation_minutes']} violation min, "
                 f"{run['replica_hours']} replica-h, {run['reversals']} reversals")
        axes[1].step(t, [x[1] for x in tl], where="post", color=color, lw=1.2, label=label)
        pm = run["_per_minute"]
        axes[2].plot(np.arange(len(pm)) / 60.0, np.maximum(pm, 1e-4) * 1000, color=color, lw=0.8, label=name)
    axes[1].set_ylabel("replicas")
    axes[1].legend(fontsize=8, loc="upper left")
    axes[2].axhline(target * 1000, color="red", ls="--", lw=1, label="target")
    axes[2].set_yscale("log")
    axes[2].set_ylabel("p99 wait (ms)")
    axes[2].set_xlabel("hours")
    axes[2].set_xlim(0, hours)
    axes[2].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.autoscaler", description=__doc__)
    parser.add_argument("--traces", default="diurnal,bursts,ramp")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args(argv)
    makers = {m.__name__: m for m in trace_lib.ALL}
    names = [n for n in args.traces.split(",") if n]
    unknown = [n for n in names if n not in makers]
    if unknown:
        parser.error(f"unknown traces {unknown}; known: {sorted(makers)}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = FleetModel()
    target = operator_spec().target_seconds
    summaries = []
    for name in names:
        trace = makers[name]()
        summary = run_trace(trace, model, args.seed)
        summaries.append(summary)
        for run in summary["runs"]:
            print(f"{name:8s} {run['autoscaler']:22s} violations={run['slo_violation_minutes']:4d} min  "
                  f"replica-h={run['replica_hours']:7.2f}  reversals={run['reversals']:3d}  "
                  f"flaps<10min={run['flaps_under_10min']:3d}  "
                  f"({run['sim_seconds']} s)", flush=True)
        if not args.no_plots:
            plot(trace, summary, target, out_dir / f"autoscaler-{name}.png")

    lines = [
        "| trace | autoscaler | SLO-violation minutes | replica-hours | reversals | of which within 10 min | scale changes |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        for run in s["runs"]:
            lines.append(f"| {s['title']} | {run['autoscaler']} | {run['slo_violation_minutes']} | "
                         f"{run['replica_hours']} | {run['reversals']} | {run['flaps_under_10min']} | {run['scale_changes']} |")
    header = (
        f"# Autoscaler benchmark\n\n`python -m bench.autoscaler` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.machine()}, seed {args.seed}). SLO: p99 scheduler_deadline_wait of each minute's "
        f"requests <= {target * 1000:g} ms. Replicas {MIN_REPLICAS}-{MAX_REPLICAS}.\n\n{CALIBRATION}\n\n"
    )
    (out_dir / "autoscaler-results.md").write_text(header + "\n".join(lines) + "\n")
    raw = {
        "calibration": CALIBRATION,
        "model": model.__dict__,
        "seed": args.seed,
        "results": [
            {**{k: v for k, v in s.items() if k != "runs"},
             "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in s["runs"]]}
            for s in summaries
        ],
    }
    (out_dir / "autoscaler-results.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
