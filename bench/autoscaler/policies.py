"""The autoscalers compared: the operator's own decision function and two baselines.

``Operator`` calls ``chattts_operator.autoscaling.decide`` as the kopf handler does (same
spec model, samples and history); nothing of it is re-implemented here. The baselines
are written from their documented algorithms:
- ``Hpa``: the HorizontalPodAutoscaler on the same wait quantile (an Object/External
  metric with a Value target): ``ceil(current * metric / target)``, no change within a
  10% tolerance, scale-down takes the highest recommendation of the last 300 s, and the
  default scale-up policies (100% or 4 pods per 15 s, whichever is more).
- ``Keda``: KEDA's Prometheus trigger as vLLM's production stack configures it, on
  ``sum(vllm:num_requests_waiting)`` with threshold 5: KEDA hands the HPA an External
  metric with an AverageValue target, so desired = ``ceil(total / 5)``, with the same HPA
  tolerance, stabilization and policies.
"""
from __future__ import annotations

import math

import numpy as np

from chattts_operator.api.autoscaling import AutoscalingSpec
from chattts_operator.autoscaling import DemandHistory, FleetSample, History, decide


class Operator:
    def __init__(self, spec: AutoscalingSpec, name: str = "operator", demand: DemandHistory | None = None):
        self.name = name
        self.spec = spec
        self.history = History()
        self.samples: list[FleetSample] = []
        self.decisions = []
        self.floors: list[tuple[float, int | None]] = []
        self.demand = demand if demand is not None else DemandHistory()

    def evaluate(self, now: float, current_replicas: int, sample: FleetSample | None) -> int:
        horizon = max(self.spec.window_seconds, self.spec.staleness_seconds)
        # A dropped scrape adds nothing: the decision sees older samples go stale, as in the operator.
        self.samples = [s for s in self.samples if now - s.time <= horizon] + ([sample] if sample else [])
        floor = self.demand.floor(now, self.spec.forecast) if self.spec.forecast.enabled else None
        rebound = self.demand.quick_rebound(now, self.spec.reversal_guard_seconds)
        decision = decide(self.spec, current_replicas, self.samples, self.history, now, floor=floor,
                          quick_rebound=rebound)
        self.history = decision.history
        self.demand.record(now, decision.sized)
        self.decisions.append(decision)
        self.floors.append((now, decision.forecast_floor))
        return decision.desired_replicas


class _HpaCore:
    """HPA's replica calculation for one metric, with its default behaviour."""

    tolerance = 0.1
    down_window = 300.0
    up_policies = (("Percent", 100, 15.0), ("Pods", 4, 15.0))

    def __init__(self, name: str, min_replicas: int, max_replicas: int):
        self.name = name
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.recommendations: list[tuple[float, int]] = []
        self.events: list[tuple[float, int]] = []

    def _metric(self, sample: FleetSample) -> float | None:
        raise NotImplementedError

    def _usage_ratio(self, current: int, sample: FleetSample) -> float:
        raise NotImplementedError

    def _raw(self, current: int, sample: FleetSample) -> int:
        raise NotImplementedError

    def evaluate(self, now: float, current: int, sample: FleetSample | None) -> int:
        if sample is None or self._metric(sample) is None:
            return current  # the HPA keeps the scale when its metric is unavailable
        ratio = self._usage_ratio(current, sample)
        raw = current if abs(ratio - 1.0) <= self.tolerance else self._raw(current, sample)
        self.recommendations = [(t, r) for t, r in self.recommendations if now - t <= self.down_window]
        # Scale-up stabilization window is 0 s by default: only the newest counts.
        down_rec = max([r for _, r in self.recommendations] + [raw])
        self.recommendations.append((now, raw))
        desired = min(max(current, raw), down_rec) if raw < current else raw
        if desired > current:
            self.events = [(t, c) for t, c in self.events if now - t < 15.0]
            added = sum(c for _, c in self.events if c > 0)
            start = current - added
            allowed = max(
                start + v if kind == "Pods" else math.ceil(start * (1 + v / 100.0))
                for kind, v, _ in self.up_policies
            )
            desired = min(desired, max(allowed, current))
        desired = max(self.min_replicas, min(self.max_replicas, desired))
        if desired != current:
            self.events.append((now, desired - current))
        return desired


class Hpa(_HpaCore):
    def __init__(self, target_seconds: float, min_replicas: int, max_replicas: int):
        super().__init__("HPA (wait quantile)", min_replicas, max_replicas)
        self.target = target_seconds

    def _metric(self, sample):
        return sample.wait_quantile if sample.wait_quantile is not None and math.isfinite(sample.wait_quantile) else None

    def _usage_ratio(self, current, sample):
        return (sample.wait_quantile or 0.0) / self.target

    def _raw(self, current, sample):
        return math.ceil(current * self._usage_ratio(current, sample))


class Keda(_HpaCore):
    def __init__(self, threshold: float, min_replicas: int, max_replicas: int):
        super().__init__("KEDA (waiting > 5)", min_replicas, max_replicas)
        self.threshold = threshold

    def _metric(self, sample):
        return sample.requests_waiting

    def _usage_ratio(self, current, sample):
        return (sample.requests_waiting or 0.0) / (self.threshold * max(current, 1))

    def _raw(self, current, sample):
        return math.ceil((sample.requests_waiting or 0.0) / self.threshold)


class ReactiveOracle:
    """The floor of what an autoscaler that sizes for the present load can do: it knows the true request
    rate of the present instant (no metric, no detection delay, no window) and, the moment
    the replicas it has would carry less than that rate, asks for ``max_replicas`` at once
    (no rate policy); it never scales down. What it still violates is the cold start's
    doing: new replicas serve ``cold_start`` later, and the requests that queued on the
    Ready replicas meanwhile stay there (the Service does not move them)."""

    name = "reactive oracle (max at once)"

    def __init__(self, rate: np.ndarray, per_replica_rate: float, max_replicas: int):
        self.rate = rate
        self.per_replica_rate = per_replica_rate
        self.max_replicas = max_replicas

    def evaluate(self, now: float, current: int, sample: FleetSample | None) -> int:
        rate_now = float(self.rate[min(int(now), len(self.rate) - 1)])
        return self.max_replicas if rate_now > current * self.per_replica_rate else current


class ClairvoyantAtArrival:
    """The bound for an autoscaler that cannot see the future: it learns the demand the instant it
    arrives (the trace's true request rate now, no metric, no window, no detection delay), sizes
    for it with no error and no rate policy, up and down at once, and pays only the cold start.
    ``held`` replicas are kept whatever the load (a spare held ahead of a rise it cannot foresee):
    the frontier between violation minutes and replica-hours that no such autoscaler passes.

    "Sizes with no error": ``headroom`` x the load at the per-replica load limit; 1.4 is the
    smallest of the margins tried (1.0, 1.2, 1.25, 1.4) with which a fleet already Ready has no
    violation minute through the crowd on any calibration (at 1.0, 5 replicas for a load of 4.2
    still miss minutes 56, 63 and 67 on the anchor)."""

    def __init__(self, rate: np.ndarray, per_replica_rate: float, min_replicas: int, max_replicas: int,
                 held: int = 0, headroom: float = 1.4):
        self.rate = rate
        self.per_replica_rate = per_replica_rate
        self.lower = max(min_replicas, held)
        self.max_replicas = max_replicas
        self.headroom = headroom
        self.name = "clairvoyant at arrival" + (f", {held} held" if held > min_replicas else "")

    def sized(self, now: float) -> int:
        rate_now = float(self.rate[min(int(now), len(self.rate) - 1)])
        needed = math.ceil(rate_now * self.headroom / self.per_replica_rate - 1e-9)
        return max(self.lower, min(self.max_replicas, needed))

    def evaluate(self, now: float, current: int, sample: FleetSample | None) -> int:
        return self.sized(now)
