"""The create ratio as several alternating pairs of sides, each on a fresh control plane (pure).

One pair (the bare writes, then the operator) gave 0.96x and 1.33x in two runs minutes apart on
the same host, whose own speed moved by 30% within the hour (findings, fifth round): one noisy
minute decided the figure. So a size's create is measured as ``pairs`` pairs whose order
alternates (drift then favours neither side), and the figure is the median of the pairs' ratios.
The last side is always the operator's, so its objects stay for the later phases.
"""
from __future__ import annotations

import statistics
from typing import Any

from bench.operator_scale.report import ratio

BASELINE = "baseline"
OPERATOR = "operator"


def side_order(pairs: int) -> list[str]:
    """The sides to run, pair after pair: the order alternates and the last pair ends with the
    operator (pairs=1: baseline, operator; pairs=2: operator, baseline, baseline, operator)."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, not {pairs}")
    sides: list[str] = []
    for p in range(pairs):
        last_first = (pairs - 1 - p) % 2 == 0  # the last pair (and every second one before it)
        sides += [BASELINE, OPERATOR] if last_first else [OPERATOR, BASELINE]
    return sides


def pair_up(results: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """[(side, that side's phase result)] in the order run -> one summary per complete pair."""
    out = []
    for first, second in zip(results[0::2], results[1::2]):
        sides = dict((first, second))
        base, op = sides.get(BASELINE) or {}, sides.get(OPERATOR) or {}
        out.append({
            "order": f"{first[0]} first",
            "baseline_children_s": base.get("seconds_children_exist"),
            "operator_children_and_status_s": op.get("seconds_children_and_status"),
            "ratio": ratio(op.get("seconds_children_and_status"), base.get("seconds_children_exist")),
            "baseline_ready_s": base.get("seconds_deployments_ready"),
            "operator_ready_s": op.get("seconds_ready"),
            "ready_ratio": ratio(op.get("seconds_ready"), base.get("seconds_deployments_ready")),
            "operator_writes_per_object": op.get("writes_per_object"),
        })
    return out


def summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median ratio over the pairs that completed (None where none did), with the spread."""
    ratios = [p["ratio"] for p in pairs if p.get("ratio") is not None]
    ready = [p["ready_ratio"] for p in pairs if p.get("ready_ratio") is not None]
    return {
        "pairs": len(pairs), "complete": len(ratios),
        "median_ratio": round(statistics.median(ratios), 2) if ratios else None,
        "min_ratio": min(ratios) if ratios else None, "max_ratio": max(ratios) if ratios else None,
        "median_ready_ratio": round(statistics.median(ready), 2) if ready else None,
    }

