"""Forecast-aware minimums, pure: the per-minute demand record and the floor it predicts.

Every evaluation reports how many replicas the load needed (``Decision.sized``: the
capacity signal's sizing, before guards and clamps); the record keeps the most of each
minute for one period plus the lead. The floor at ``now`` is the most any minute of
``[now - period, now - period + lead]`` needed: what the same stretch of the last period
asked for, ``lead`` early, so replicas started for a rise that repeats are Ready when it
comes (the lead covers a cold start). One period of record is one day of ints per object
(1,440 minutes), kept in memory: a restarted operator forecasts again after a period.

Why the previous period and not a fitted model (Holt-Winters, ARIMA): the floor only ever
raises replicas, so its error costs replica-hours, never SLO; the most the same stretch
needed is the simplest forecast whose error is bounded by how much two days differ, and
it is explainable in one sentence of status.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from chattts_operator.api.autoscaling import ForecastSpec

MINUTE = 60.0


@dataclass
class DemandHistory:
    """minute index (epoch minutes) -> the most replicas the load needed in that minute."""

    minutes: dict[int, int] = field(default_factory=dict)

    def record(self, now: float, needed: int | None, keep: float = 86400.0 + 3600.0) -> None:
        if needed is None:
            return
        minute = int(now // MINUTE)
        self.minutes[minute] = max(needed, self.minutes.get(minute, 0))
        oldest = minute - int(math.ceil(keep / MINUTE))
        if next(iter(self.minutes)) < oldest:
            self.minutes = {m: n for m, n in self.minutes.items() if m >= oldest}

    def floor(self, now: float, spec: ForecastSpec) -> int | None:
        """The forecast floor at ``now``; None while the record does not reach back a period."""
        start = int((now - spec.period_seconds) // MINUTE)
        end = int((now - spec.period_seconds + spec.lead_seconds) // MINUTE)
        if not self.minutes or min(self.minutes) > start:
            return None
        seen = [self.minutes[m] for m in range(start, end + 1) if m in self.minutes]
        return max(seen) if seen else None
