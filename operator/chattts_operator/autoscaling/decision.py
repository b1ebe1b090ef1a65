"""The autoscaling decision: a pure function of (spec, replicas, samples, history, now, cap).

Baseline semantics are the HorizontalPodAutoscaler's (tolerance, stabilization windows
that take the lowest recent recommendation for scale-up and the highest for scale-down,
Pods/Percent rate policies, min/max clamp). What differs is how the raw recommendation
is computed, because the metric is a queueing delay and not a utilization:

- A wait quantile is ~0 at any load the fleet can carry and explodes past saturation, so
  HPA's ``ceil(current * metric / target)`` sends an idle-looking fleet to minReplicas and
  a saturated one to many times what it needs.
- The runtime also exports how many requests each pod runs and holds waiting, and how
  many it can run at once (its batch slots). Requests in flight behave like the busy
  servers of an M/G/infinity system: their count is Poisson, so a replica with ``s`` slots
  keeps the chosen wait quantile at ~0 while its mean in-flight load ``x`` satisfies
  ``P(Poisson(x) >= s) <= 1 - quantile`` (per replica, because the Service spreads
  requests at random; a square-root staffing rule). Desired replicas are the fleet's
  demand divided by that per-replica load, with demand taken as the larger of its
  window mean and a one-window linear extrapolation (new replicas need time to start).
- The measured wait stays the feedback signal: while it is above target the fleet grows
  at least by what the backlog needs (``current * (running + waiting) / running``) and by
  one replica, whatever the sizing says (the slot count might be wrong); a scale-down is
  never recommended while the wait is above target.
- Without queue metrics (e.g. a Prometheus query returning only the wait) the decision
  falls back to HPA's ratio on the wait quantile.

When the wait is missing or NaN but the queue gauges still answer (the histogram dropped,
a recording rule broken), the decision runs on the queue alone: requests waiting for a slot
mean the wait is above any target a step long, growth follows the sizing and the backlog as
usual, and nothing is scaled down while the wait is unknown. When no sample is fresh at all,
the demand's trend before the gap (kept in the history) is extrapolated at most one window
ahead: a burst caught at its onset is still grown for; a flat or falling trend holds. Neither
ever scales down. With neither gauges nor a trend, missing, stale or NaN metrics hold the
current replicas (only the min/max/cap clamp still applies), and pods that did not answer
block scale-down, never scale-up.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from chattts_operator.api.autoscaling import AutoscalingSpec, ScalingRules, format_duration


@dataclass(frozen=True)
class FleetSample:
    """What the metric readers saw at ``time`` (epoch seconds).

    ``wait_quantile`` is the chosen quantile of scheduler_deadline_wait over the
    evaluation window, in seconds: NaN or None when unknown. ``observed_requests`` is how
    many requests the window's histogram holds (0 with a known 0 wait means idle; None
    when the source cannot tell). The queue fields are sums over the pods that answered;
    ``slots_per_replica`` is how many requests one replica runs at once (maxNumSeqs)."""

    time: float
    wait_quantile: float | None
    observed_requests: float | None = None
    ready_replicas: int = 0
    unreachable_replicas: int = 0
    requests_running: float | None = None
    requests_waiting: float | None = None
    slots_per_replica: float | None = None
    # Frames generated per second across the Ready replicas over the window (the rate of
    # the runtime's chattts_batch_size_sum): work served, whatever the batch size.
    frames_per_second: float | None = None

    @property
    def demand(self) -> float | None:
        """Requests in flight across the fleet (running + waiting), if known."""
        if self.requests_running is None or self.requests_waiting is None:
            return None
        if not (math.isfinite(self.requests_running) and math.isfinite(self.requests_waiting)):
            return None
        return self.requests_running + self.requests_waiting


@dataclass(frozen=True)
class History:
    """What must persist between evaluations (the controller keeps it in status).

    ``recommendations`` are (time, replicas) raw recommendations for the stabilization
    windows; ``scale_events`` are (time, change) replica changes for the rate policies."""

    recommendations: tuple[tuple[float, int], ...] = ()
    scale_events: tuple[tuple[float, int], ...] = ()
    # The reversal guard's clock: when replicas were last added.
    last_scale_up: float | None = None
    # The capacity signal's unit: the engine's step time near the per-replica load limit,
    # learned from running / frames-per-second while the replicas run that loaded.
    step_seconds: float | None = None
    # The demand's trend at the newest fresh sample: (time, requests in flight, growth per
    # second, per-replica load limit); what a gap in the metrics is decided from.
    # In memory only (not in status, not compared): a restarted operator relearns it.
    trend: tuple[float, float, float, float] | None = field(default=None, compare=False)
    # How long a request runs, by Little's law (running / starts per second), learned while the
    # wait histogram answers: what sizes the arrivals through a cold start when it does not.
    # In memory only, like the trend.
    service_seconds: float | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Decision:
    desired_replicas: int
    reason: str
    message: str
    metric_value: float | None
    # False when the wait was missing/stale/NaN: the decision came from the queue gauges or the
    # demand's trend before the gap (never a scale-down), or holds.
    metric_ok: bool
    # Why the result differs from the raw recommendation, if it does: "", "MinReplicas",
    # "MaxReplicas", "GPUShare", "ScaleUpPolicy", "ScaleDownPolicy", "Stabilized",
    # "ReversalGuard", "ForecastFloor".
    limited_by: str
    raw_recommendation: int | None
    history: History = field(default_factory=History)
    # How many replicas the load needs now (the sizing, before guards and clamps): what the
    # forecast records per minute. None when the metric held.
    sized: int | None = None
    forecast_floor: int | None = None
    # With metric_ok False, what was wrong with the wait ("MissingMetric", "StaleMetric",
    # "InvalidMetric"): the ScalingActive condition's reason, whatever was decided.
    metric_problem: str = ""



def per_replica_load_limit(slots: float, quantile: float) -> float:
    """Mean in-flight requests per replica that keeps the chosen wait quantile at ~0.

    A request waits only when it reaches a replica whose slots are all busy; with a
    Poisson number of requests in flight (mean x) that happens with probability
    P(N >= slots). The largest x with P(N >= slots) <= 1 - quantile, found by bisection."""
    if not slots > 0:
        raise ValueError(f"slots must be positive, got {slots}")
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    whole = max(int(math.floor(slots)), 1)
    allowed = 1.0 - quantile

    def tail(mean: float) -> float:  # P(N >= whole), N ~ Poisson(mean), summed in log space
        log_mean = math.log(mean) if mean > 0 else -math.inf
        cdf = sum(math.exp(k * log_mean - mean - math.lgamma(k + 1)) for k in range(whole))
        return max(0.0, 1.0 - cdf)

    low, high = 0.0, float(whole)
    for _ in range(60):
        mid = (low + high) / 2.0
        if tail(mid) <= allowed:
            low = mid
        else:
            high = mid
    return max(low, 1e-6)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _fresh_samples(samples: Sequence[FleetSample], now: float, staleness: float) -> list[FleetSample]:
    # A sample from the future (clock skew beyond a second) is as untrustworthy as a stale one.
    return [s for s in samples if now - staleness <= s.time <= now + 1.0]


def _level(values: Sequence[float]) -> tuple[float, float] | None:
    """A (low, high) estimate of a load level from its samples, oldest first.

    Gauges read at one instant are noisy (Poisson), so growth needs the window mean and
    the newest sample to agree (low = the smaller), and shrinking needs both to allow it
    (high = the larger). When the two newest samples both stand above the older ones by
    more than Poisson noise, a burst has begun: growth follows it at once (new replicas
    take minutes to start); one high sample alone is noise."""
    if not values:
        return None
    mean = sum(values) / len(values)
    latest = values[-1]
    if len(values) >= 3:
        # Two newest samples both beyond 3 sigma of the older ones' Poisson noise: a burst.
        older = values[:-2]
        base = sum(older) / len(older)
        bar = base + 3.0 * math.sqrt(max(base, 1.0))
        if values[-2] > bar and latest > bar:
            level = min(values[-2], latest)
            return level, max(level, mean)
    return min(mean, latest), max(mean, latest)


def fleet_demand(samples: Sequence[FleetSample]) -> tuple[float, float] | None:
    """Requests in flight the fleet must carry, as a (low, high) pair of estimates."""
    return _level([s.demand for s in samples if s.demand is not None])


def fleet_work(samples: Sequence[FleetSample], step_seconds: float | None) -> tuple[float, float] | None:
    """The capacity signal: frames served per second times the step time near the load
    limit, i.e. the requests in flight the fleet would hold if every replica ran at that
    load. Unlike requests in flight it does not swing with the batch size: a request in
    flight on a lightly loaded replica (short steps) counts for less than one on a busy
    replica, in proportion to the frames it gets. None until the step time is learned."""
    if step_seconds is None:
        return None
    values = [s.frames_per_second * step_seconds for s in samples if _finite(s.frames_per_second)]
    return _level(values) if len(values) == len(samples) else None


def learn_step_seconds(previous: float | None, samples: Sequence[FleetSample], limit: float) -> float | None:
    """The step time near the load limit, from the window's running gauges and frame rate:
    every running request gets one frame per step, so step = running / frames-per-second.
    Learned only while the replicas run at least 3/4 of the limit (a step at batch 1 is
    much shorter than one at 16 on some engines), smoothed over evaluations."""
    usable = [s for s in samples if _finite(s.frames_per_second) and s.frames_per_second > 0
              and s.requests_running is not None and s.ready_replicas > 0]
    if not usable:
        return previous
    running = sum(s.requests_running for s in usable) / len(usable)
    ready = sum(s.ready_replicas for s in usable) / len(usable)
    if running / ready < 0.75 * limit:
        return previous
    observed = running / (sum(s.frames_per_second for s in usable) / len(usable))
    return observed if previous is None else 0.8 * previous + 0.2 * observed


def demand_ahead(samples: Sequence[FleetSample]) -> float:
    """Requests in flight one evaluation ahead: the newest sample plus the growth since the
    one before (a linear extrapolation over one interval; no growth, no extrapolation)."""
    known = [s.demand for s in samples if s.demand is not None]
    if not known:
        return 0.0
    if len(known) == 1:
        return known[-1]
    return known[-1] + max(known[-1] - known[-2], 0.0)


def arrivals_in_flight(samples: Sequence[FleetSample], window_seconds: float) -> float | None:
    """Requests in flight the arrivals would hold once every one of them starts at once, by
    Little's law: the requests running x (arrival rate / start rate), the arrival rate being the
    start rate (the window's wait observations over the window) plus the waiting queue's growth
    across the samples. None when the window saw no start or the gauges are unknown.

    While replicas start, the queue on the Ready ones grows by the arrivals they cannot take,
    and no new replica drains it (a Service routes a request once, at arrival): sizing for the
    requests in flight, queue included, asks for more with every evaluation of the cold start."""
    if not samples:
        return None
    first, last = samples[0], samples[-1]
    if (not last.observed_requests or last.requests_running is None or last.requests_waiting is None
            or first.requests_waiting is None or window_seconds <= 0):
        return None
    starts = last.observed_requests / window_seconds
    span = last.time - first.time
    growth = max(last.requests_waiting - first.requests_waiting, 0.0) / span if span > 0 else 0.0
    return last.requests_running * (starts + growth) / starts


def learn_service_seconds(previous: float | None, samples: Sequence[FleetSample], window_seconds: float) -> float | None:
    """How long a request runs: the running requests over the window's start rate (Little's law),
    smoothed over evaluations like the step time. Unchanged without starts or gauges."""
    usable = [s for s in samples if s.requests_running is not None]
    last = samples[-1] if samples else None
    if not usable or last is None or not last.observed_requests or window_seconds <= 0:
        return previous
    running = sum(s.requests_running for s in usable) / len(usable)
    if running <= 0:
        return previous
    observed = running / (last.observed_requests / window_seconds)
    return observed if previous is None else 0.8 * previous + 0.2 * observed


def arrivals_by_service(samples: Sequence[FleetSample], service_seconds: float | None) -> float | None:
    """``arrivals_in_flight`` without the window's start count (the wait histogram is missing):
    the starts are the running requests over the learned service time, so the arrivals in flight
    are the running requests plus the waiting queue's growth per second times that service time."""
    if not samples or not service_seconds or service_seconds <= 0:
        return None
    first, last = samples[0], samples[-1]
    if last.requests_running is None or last.requests_waiting is None or first.requests_waiting is None:
        return None
    span = last.time - first.time
    growth = max(last.requests_waiting - first.requests_waiting, 0.0) / span if span > 0 else 0.0
    return last.requests_running + growth * service_seconds


# Sigmas of Poisson noise a fleet is grown to carry beyond its level (shrink_headroom keeps
# SHRINK_SIGMAS): 1.5 is the largest tried (1.5, 2, 3) with no quick reversal anywhere.
GROWTH_SIGMAS = 1.5
# Sigmas a smaller fleet must still carry. 3.5, not 3: with the cold-start sizing
# (arrivals_in_flight) a fleet between the sudden bursts held one replica fewer and the next
# burst found it short (anchor: 12 violation minutes, bar 10); 3.5 meets it, 4 reverses within
# 10 minutes on two (trace, calibration) pairs.
SHRINK_SIGMAS = 3.5
# Replicas the growth room adds beyond the sizing, at most (see raw_recommendation).
ROOM_SPARES = 1


def growth_headroom(level: float) -> float:
    """Load a fleet is grown to carry: the level plus GROWTH_SIGMAS of Poisson noise."""
    return level + GROWTH_SIGMAS * math.sqrt(max(level, 0.0))


def shrink_headroom(level: float) -> float:
    """Load a smaller fleet must still carry: the level plus SHRINK_SIGMAS of Poisson noise.
    Scale-downs that leave no room for ordinary noise are reversed minutes later."""
    return level + SHRINK_SIGMAS * math.sqrt(max(level, 0.0))


def raw_recommendation(
    spec: AutoscalingSpec, current: int, samples: Sequence[FleetSample], step_seconds: float | None = None,
    wait_known: bool = True, service_seconds: float | None = None,
) -> tuple[int, str, int | None]:
    """The unclamped replica count the metrics ask for, the why, and the sizing alone
    (what the load needs, None on the HPA fallback).

    ``samples`` are the fresh samples of the evaluation window, oldest first. With
    ``wait_known`` False (the newest sample has no wait, the queue gauges answer) the wait is
    taken as above target while a request waits for a slot, and no scale-down is recommended."""
    latest = samples[-1]
    target = spec.target_seconds
    wait = latest.wait_quantile if _finite(latest.wait_quantile) else 0.0
    ratio = wait / target
    above = ratio > 1.0 + spec.tolerance
    if not wait_known:
        # A request waiting for a slot waits at least a whole request's share of a step: the
        # wait is over any target near a step. No waiting request: the wait is unknown, not low.
        above = (latest.requests_waiting or 0.0) >= 1.0
        ratio = 1.0
    demand = fleet_demand(samples)
    slots = latest.slots_per_replica

    if demand is None or not _finite(slots) or slots <= 0:
        # HPA semantics on the wait quantile.
        if abs(ratio - 1.0) <= spec.tolerance:
            return current, f"wait {format_duration(wait)} within tolerance of target", None
        return math.ceil(current * ratio), f"wait {format_duration(wait)} vs target (HPA ratio {ratio:.2f})", None

    limit = per_replica_load_limit(slots, spec.quantile)
    work = fleet_work(samples, step_seconds)
    # Growth follows whichever signal asks for more (requests in flight react within one
    # scrape; the frame rate is a window average); shrinking follows the capacity signal
    # alone once it is known, since in-flight counts fall when a replica is added.
    grow_level = max(demand[0], work[0]) if work else demand[0]
    shrink_level = work[1] if work else demand[1]
    needed = math.ceil(grow_level / limit - 1e-9)
    unit = "load at the limit's step time" if work else "requests in flight"
    why = (f"{grow_level:.1f}-{shrink_level:.1f} {unit}, {limit:.1f} per replica keeps "
           f"p{spec.quantile * 100:g} wait under target")
    if above:
        # The sizing may be wrong (slots, routing): the backlog says what the Ready
        # replicas lack. Replicas still starting count as help on the way.
        ready = latest.ready_replicas
        arrivals = None
        if ready < current:
            arrivals = (arrivals_in_flight(samples, spec.window_seconds) if wait_known
                        else arrivals_by_service(samples, service_seconds))
        if arrivals is not None:
            # Replicas are starting: the queue stuck on the Ready ones is the cold start's doing and
            # no added replica takes it; size for the arrivals (the crowd asked 16 where 10 carry it).
            recommended = math.ceil(growth_headroom(arrivals) / limit - 1e-9)
            why += f"; replicas starting: sized for the arrivals ({arrivals:.1f} in flight by Little's law)"
        else:
            running = latest.requests_running or 0.0
            backlog = math.ceil(ready * (latest.demand or 0.0) / running) if running > 0 and ready > 0 else current + 1
            # A sustained deficit grows the queue while new replicas start: size for the demand
            # one evaluation ahead (the newest growth, extrapolated), not the demand already
            # seen, or every evaluation adds a step that pays its own cold start.
            ahead = demand_ahead(samples)
            recommended = max(math.ceil(max(demand[1], shrink_level, ahead) / limit - 1e-9), backlog)
        if recommended <= current and ready >= current:
            recommended = current + 1
        said = f"wait {format_duration(wait)} above target" if wait_known else (
            f"wait unknown, {latest.requests_waiting:.0f} request(s) waiting for a slot")
        return max(recommended, current), f"{said}; {why}", max(needed, 1)
    # Grow to carry the level plus 1.5 sigma of its Poisson noise (shrinking keeps 3.5 sigma and
    # the tolerance: the band between them is the hysteresis). At a low load it holds a second
    # replica before a rise: a crowd that finds one Ready replica queues on it through a whole
    # cold start, and a Service never moves what queued there.
    # The room is one spare at most: more is growth no load asks for, and it restarts the reversal
    # guard (a room-only scale-up at a burst's peak pushed the scale-down after it into the next
    # burst: a reversal within 10 minutes on the graph-engine bursts).
    grow_to = max(needed, min(math.ceil(growth_headroom(grow_level) / limit - 1e-9), max(needed, 1) + ROOM_SPARES))
    if grow_to > current:
        if grow_to > needed:
            why += f"; room for {GROWTH_SIGMAS:g} sigma of noise"
        return grow_to, why, needed
    # Shrink only when the smaller fleet still carries the level plus its noise, and
    # never at the knee (wait near target): one replica less would push the wait over.
    # Never below what growth would ask for at once (requests in flight now).
    shrink_to = max(math.ceil(shrink_headroom(shrink_level) * (1.0 + spec.tolerance) / limit - 1e-9), needed)
    if shrink_to < current and ratio <= 1.0 - spec.tolerance:
        return shrink_to, why, max(needed, 1)
    return current, f"holding: {why}", max(needed, 1)


def _stabilize(
    current: int, recommendation: int, now: float, history: History, up: ScalingRules, down_seconds: float
) -> int:
    """HPA's stabilization: the lowest recommendation of the up window, the highest of the down window."""
    up_window = [r for t, r in history.recommendations if now - t <= up.stabilization_window_seconds]
    down_window = [r for t, r in history.recommendations if now - t <= down_seconds]
    up_recommendation = min(up_window + [recommendation])
    down_recommendation = max(down_window + [recommendation])
    result = current
    if result < up_recommendation:
        result = up_recommendation
    if result > down_recommendation:
        result = down_recommendation
    return result


def _rate_limit(current: int, desired: int, now: float, history: History, rules: ScalingRules, up: bool) -> int:
    """HPA's rate policies: what the policies allow relative to the replicas at each period's start."""
    if desired == current:
        return desired
    if rules.select_policy == "Disabled":
        return current
    if not rules.policies:
        return desired
    proposals = []
    for policy in rules.policies:
        changed = sum(
            change for t, change in history.scale_events
            if now - t < policy.period_seconds and (change > 0) == up and change != 0
        )
        start = current - changed  # for down-scaling `changed` is negative: start is larger
        if up:
            proposals.append(
                start + policy.value if policy.type == "Pods" else math.ceil(start * (1 + policy.value / 100.0))
            )
        else:
            proposals.append(
                start - policy.value if policy.type == "Pods" else math.floor(start * (1 - policy.value / 100.0))
            )
    if up:
        allowed = max(proposals) if rules.select_policy == "Max" else min(proposals)
        return min(desired, max(allowed, current))
    allowed = min(proposals) if rules.select_policy == "Max" else max(proposals)
    return max(desired, min(allowed, current))


def _prune(history: History, now: float, spec: AutoscalingSpec) -> History:
    behavior = spec.behavior
    keep_recs = max(behavior.scale_up.stabilization_window_seconds, spec.behavior.scale_down.stabilization_window_seconds)
    keep_events = max(
        [p.period_seconds for p in behavior.scale_up.policies + behavior.scale_down.policies] or [0]
    )
    return replace(
        history,
        recommendations=tuple((t, r) for t, r in history.recommendations if now - t <= keep_recs),
        scale_events=tuple((t, c) for t, c in history.scale_events if now - t < keep_events),
    )


def decide(
    spec: AutoscalingSpec,
    current_replicas: int,
    samples: Sequence[FleetSample],
    history: History,
    now: float,
    cap: int | None = None,
    floor: int | None = None,
    quick_rebound: bool | None = None,
) -> Decision:
    """Desired replicas for one evaluation.

    ``samples`` are the recent fleet samples, oldest first (the last is the newest);
    ``cap`` is the most replicas the GPU rebalancing schedule allows now (None: no cap);
    ``floor`` is the forecast's minimum (``forecast.DemandHistory.floor``; None: none),
    bounded by maxReplicas and the cap like everything else.
    The returned history replaces the given one.

    The reversal guard's rule: no scale-down within ``reversalGuard`` (10 min) of the last
    scale-up unless the replicas are idle (nothing running or waiting, no request in the
    window). Scale-downs themselves leave 3.5 sigma of Poisson noise of room
    (``shrink_headroom``) over the highest load of the down-stabilization window, so the
    load that follows a scale-down rarely asks for the replica back; growth leaves 1.5 sigma
    (``growth_headroom``, one spare replica at most), so the band between the two is the
    hysteresis.

    ``quick_rebound`` is ``forecast.DemandHistory.quick_rebound``: False when the last hour's
    demand record holds no deep dip that came back within the reversal guard. Then a deep drop
    (the load asks for half the replicas or fewer) takes the highest recommendation of
    ``deepDropWindow`` (1 min) instead of the scale-down window; True or None (unknown) keep it.
    While the wait is above target the recommendation covers the demand one evaluation ahead
    (``demand_ahead``), or, while replicas are still starting, the arrivals (``arrivals_in_flight``).

    Without the wait: the queue gauges decide when they answer (``raw_recommendation`` with
    ``wait_known`` False; the arrivals by ``arrivals_by_service``); with no fresh sample, the
    demand's trend before the gap (``History.trend``, ``_decide_blind``). Neither scales down."""
    if current_replicas < 0:
        raise ValueError(f"current_replicas must be >= 0, got {current_replicas}")
    if spec.max_replicas is None:
        raise ValueError("autoscaling.maxReplicas is required to decide")
    upper = spec.max_replicas if cap is None else min(spec.max_replicas, cap)
    forecast_floor = min(floor, upper) if floor is not None and floor > spec.min_replicas else None
    lower = min(max(spec.min_replicas, forecast_floor or 0), upper)
    history = _prune(history, now, spec)

    def clamp(value: int) -> tuple[int, str]:
        if value > upper:
            return upper, ("GPUShare" if cap is not None and cap < spec.max_replicas else "MaxReplicas")
        if value < lower:
            return lower, ("ForecastFloor" if forecast_floor is not None and lower > spec.min_replicas
                           else "MinReplicas")
        return value, ""

    fresh = _fresh_samples(samples, now, spec.staleness_seconds)
    latest = fresh[-1] if fresh else None
    problem = None
    wait_known = True
    if not samples:
        problem = ("HoldMissingMetric", "no metric sample yet")
    elif latest is None:
        age = now - samples[-1].time
        problem = ("HoldStaleMetric", f"newest sample is {format_duration(max(age, 0.0))} old (staleness {spec.staleness})")
    elif latest.wait_quantile is None or not math.isfinite(latest.wait_quantile):
        if latest.observed_requests == 0 and latest.unreachable_replicas == 0 and not latest.demand:
            latest = FleetSample(**{**latest.__dict__, "wait_quantile": 0.0})  # idle: no request to wait
            fresh[-1] = latest
        elif latest.demand is not None and _finite(latest.slots_per_replica) and latest.slots_per_replica > 0:
            wait_known = False  # the queue gauges still answer: decide from them
        else:
            problem = ("HoldInvalidMetric", "wait quantile is missing or NaN")
    elif latest.wait_quantile < 0:
        problem = ("HoldInvalidMetric", f"wait quantile is negative ({latest.wait_quantile})")

    if problem is not None:
        return _decide_blind(spec, current_replicas, history, now, problem, clamp, forecast_floor)

    assert latest is not None
    in_window = [s for s in fresh if now - s.time <= spec.window_seconds] or [latest]
    slots = latest.slots_per_replica
    if _finite(slots) and slots > 0:
        limit = per_replica_load_limit(slots, spec.quantile)
        history = replace(history, step_seconds=learn_step_seconds(history.step_seconds, in_window, limit),
                          trend=_trend(in_window, limit))
    if wait_known:
        history = replace(history, service_seconds=learn_service_seconds(
            history.service_seconds, in_window, spec.window_seconds))
    recommendation, why, sized = raw_recommendation(spec, current_replicas, in_window, history.step_seconds,
                                                    wait_known=wait_known, service_seconds=history.service_seconds)
    if not wait_known:
        why = "wait metric missing, decided from the queue gauges: " + why
    if recommendation < current_replicas and latest.unreachable_replicas > 0:
        recommendation = current_replicas
        why += f"; {latest.unreachable_replicas} pod(s) did not answer: no scale-down"
    elif (recommendation < current_replicas and now - in_window[0].time < spec.window_seconds / 2
          and not _idle(in_window)):
        recommendation = current_replicas  # a fresh start: the load of a partial window is no evidence to shrink
        why += "; samples cover less than half the window: no scale-down"

    behavior = spec.behavior
    down_window = behavior.scale_down.stabilization_window_seconds
    # A drop of one replica is never deep (2 -> 1 is what noise does at a low load).
    if quick_rebound is False and 2 * recommendation <= current_replicas and current_replicas - recommendation >= 2:
        # A deep drop is no noise, and the last hour shows no load that came back that soon.
        down_window = min(down_window, spec.deep_drop_window_seconds)
        if down_window < behavior.scale_down.stabilization_window_seconds:
            why += f"; deep drop, no quick rebound in the last hour: scale-down window {spec.deep_drop_window}"
    stabilized = _stabilize(current_replicas, recommendation, now, history, behavior.scale_up, down_window)
    limited_by = "Stabilized" if stabilized != recommendation else ""
    if stabilized > current_replicas:
        limited_value = _rate_limit(current_replicas, stabilized, now, history, behavior.scale_up, up=True)
        if limited_value != stabilized:
            limited_by = "ScaleUpPolicy"
    elif stabilized < current_replicas:
        limited_value = _rate_limit(current_replicas, stabilized, now, history, behavior.scale_down, up=False)
        if limited_value != stabilized:
            limited_by = "ScaleDownPolicy"
    else:
        limited_value = stabilized
    guarded = history.last_scale_up is not None and now - history.last_scale_up < spec.reversal_guard_seconds
    if limited_value < current_replicas and guarded and not _idle(in_window):
        limited_value = current_replicas
        limited_by = "ReversalGuard"
        why += (f"; no scale-down within {spec.reversal_guard} of the scale-up "
                f"{format_duration(now - history.last_scale_up)} ago")
    desired, clamp_reason = clamp(limited_value)
    limited_by = clamp_reason or limited_by

    if desired > current_replicas:
        reason = "ScaleUp"
    elif desired < current_replicas:
        reason = "ScaleDown"
    else:
        reason = "HoldStable"
    message = f"recommended {recommendation}: {why}"
    if limited_by == "ForecastFloor":
        reason = "ScaleUpForecast" if desired > current_replicas else reason
        message += f"; forecast floor {forecast_floor} (the load {spec.forecast.period} ago, {spec.forecast.lead} ahead)"
    elif limited_by:
        message += f"; limited by {limited_by}"
    return Decision(
        desired_replicas=desired, reason=reason, message=message,
        metric_value=latest.wait_quantile if wait_known else None,
        metric_ok=wait_known, metric_problem="" if wait_known else "InvalidMetric",
        limited_by=limited_by, raw_recommendation=recommendation,
        history=_record(history, now, recommendation, current_replicas, desired),
        sized=sized, forecast_floor=forecast_floor,
    )


def _trend(samples: Sequence[FleetSample], limit: float) -> tuple[float, float, float, float] | None:
    """(time, requests in flight, growth per second, load limit) at the newest sample with gauges:
    the growth between the two newest such samples, none with one."""
    known = [s for s in samples if s.demand is not None]
    if not known:
        return None
    newest = known[-1]
    growth = 0.0
    if len(known) >= 2 and newest.time > known[-2].time:
        growth = (newest.demand - known[-2].demand) / (newest.time - known[-2].time)
    return newest.time, newest.demand, growth, limit


def _decide_blind(spec: AutoscalingSpec, current: int, history: History, now: float, problem: tuple[str, str],
                  clamp, forecast_floor: int | None) -> Decision:
    """No usable sample: grow for the demand's trend before the gap, extrapolated at most one
    window past its newest sample (a burst caught at its onset); otherwise hold. Never shrinks
    (only the min/max/cap clamp may lower the replicas)."""
    reason, message = problem
    metric_problem = reason.removeprefix("Hold")
    trend = history.trend
    recommendation = None
    if trend is not None and now - trend[0] <= spec.staleness_seconds + spec.window_seconds:
        at, demand, growth, limit = trend
        ahead = demand + max(growth, 0.0) * min(now - at, spec.window_seconds)
        needed = math.ceil(growth_headroom(ahead) / limit - 1e-9)
        if needed > current and growth > 0:
            recommendation = needed
    if recommendation is None:
        held, limited = clamp(current)
        if held != current:
            reason = "ScaleUp" if held > current else "ScaleDown"
            message += f"; clamped to {limited}"
        return Decision(
            desired_replicas=held, reason=reason, message=message + "; holding replicas",
            metric_value=None, metric_ok=False, metric_problem=metric_problem, limited_by=limited,
            raw_recommendation=None, history=_record(history, now, None, current, held), forecast_floor=forecast_floor,
        )
    limited_value = _rate_limit(current, recommendation, now, history, spec.behavior.scale_up, up=True)
    limited_by = "ScaleUpPolicy" if limited_value != recommendation else ""
    desired, clamp_reason = clamp(limited_value)
    limited_by = clamp_reason or limited_by
    message += (f"; the demand was rising before the gap ({trend[1]:.1f} in flight, +{trend[2]:.2f}/s): "
                f"recommended {recommendation} for it {format_duration(min(now - trend[0], spec.window_seconds))} "
                f"ahead")
    if limited_by:
        message += f"; limited by {limited_by}"
    return Decision(
        desired_replicas=desired, reason="ScaleUp" if desired > current else ("ScaleDown" if desired < current
                                                                              else reason),
        message=message, metric_value=None, metric_ok=False, metric_problem=metric_problem, limited_by=limited_by,
        raw_recommendation=recommendation, history=_record(history, now, recommendation, current, desired),
        forecast_floor=forecast_floor,
    )


def _idle(samples: Sequence[FleetSample]) -> bool:
    """Nothing running or waiting and no request seen in the window: the replicas are idle."""
    return all(s.demand == 0 and s.observed_requests == 0 for s in samples)


def _record(history: History, now: float, recommendation: int | None, current: int, desired: int) -> History:
    recommendations = history.recommendations
    if recommendation is not None:
        recommendations = recommendations + ((now, recommendation),)
    events = history.scale_events
    if desired != current:
        events = events + ((now, desired - current),)
    last_up = now if desired > current else history.last_scale_up
    return replace(history, recommendations=recommendations, scale_events=events, last_scale_up=last_up)
