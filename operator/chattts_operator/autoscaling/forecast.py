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
# How far back quick_rebound looks for load that fell deep and came back (an hour).
REBOUND_LOOKBACK = 3600.0


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

    def quick_rebound(self, now: float, within: float, lookback: float = REBOUND_LOOKBACK) -> bool | None:
        """Whether the record of the last ``lookback`` seconds holds load that fell deep and came
        back within ``within`` (the reversal guard): from a minute's need, down to at most half
        of it (and by 2 replicas at least), and back to it, all within ``within``. None while
        the record does not cover the lookback (after a start: unknown, the caller stays careful)."""
        last = int(now // MINUTE)
        first = last - int(lookback // MINUTE)
        span = max(int(within // MINUTE), 1)
        if not self.minutes or min(self.minutes) > first:
            return None
        needed = [self.minutes.get(m) for m in range(first, last + 1)]
        for peak_at, peak in enumerate(needed):
            if peak is None or peak < 2:
                continue
            excursion = [n for n in needed[peak_at + 1:peak_at + 1 + span] if n is not None]
            for k, n in enumerate(excursion):
                if n >= peak:
                    break  # back at the peak without a deep dip first: try the next peak
                if peak - n >= 2 and 2 * n <= peak and any(m >= peak for m in excursion[k + 1:]):
                    return True
        return False
