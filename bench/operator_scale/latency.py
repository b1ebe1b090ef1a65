"""Where a spec change's reaction time goes, as far as the benchmark can see it.

``segment_summary`` cuts each change at the points this process observes: the PATCH's answer,
the watch event of the new generation (the change visible to every watcher, the operator's
too) and the Deployment's new template; it reports each segment's percentiles and the
slowest changes whole, so a tail says whether it was the API server before the operator saw
the change or the operator and the apply after. ``GcPauses`` measures this process's own
garbage-collector pauses (a paused observer stamps events late) and ``full_collections`` the
operator's, from its ``chattts_operator_gc_pause_seconds`` histogram.
"""
from __future__ import annotations

import math
from typing import Any

from chattts_operator.core.heap import HeapCollector

SEGMENTS = ("patch_answered", "visible", "visible_to_deployment", "total")
SLOWEST = 5


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def segment_summary(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p90/p99/max of each segment in ms, and the slowest changes' segments."""
    if not segments:
        return {}
    out: dict[str, Any] = {}
    for key in SEGMENTS:
        values = [s[key] for s in segments]
        out[key] = {f"p{q}": round(1000 * percentile(values, q), 1) for q in (50, 90, 99)} | {
            "max": round(1000 * max(values), 1)}
    out["slowest"] = [{k: (round(1000 * v, 1) if k != "name" else v) for k, v in s.items()}
                      for s in sorted(segments, key=lambda s: s["total"], reverse=True)[:SLOWEST]]
    return out


def full_collections(histogram: dict[str, float]) -> dict[str, Any]:
    """The operator's full collections over a phase, from the deltas of its gc pause histogram
    (keys ``gc2_count``, ``gc2_sum``, ``gc2 <= LE s``)."""
    count = int(histogram.get("gc2_count", 0))
    out: dict[str, Any] = {"count": count, "total_ms": round(1000 * histogram.get("gc2_sum", 0.0), 1)}
    for key, value in histogram.items():
        if key.startswith("gc2 <= "):
            out["over " + key.removeprefix("gc2 <= ")] = count - int(value)
    return out


class GcPauses:
    """This process's collector pauses while installed: the operator's own measuring hook
    (core/heap.py) with freezing off, summarised for a phase."""

    def __init__(self) -> None:
        self._collector = HeapCollector(freeze_survivors=False, thaw_seconds=math.inf)

    def install(self) -> "GcPauses":
        self._collector.install()
        return self

    def uninstall(self) -> None:
        self._collector.uninstall()

    def summary(self) -> dict[str, Any]:
        pauses = list(self._collector.pauses)
        full = [s for g, s in pauses if g == 2]
        return {"collections": len(pauses), "full": len(full),
                "total_ms": round(1000 * sum(s for _, s in pauses), 1),
                "max_ms": round(1000 * max((s for _, s in pauses), default=0.0), 1)}
