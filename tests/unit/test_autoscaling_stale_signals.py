"""The decision when the wait metric is missing or stale: what is still known (the queue gauges,
the service time learned before, the demand's trend before the gap) decides, never a scale-down."""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import pytest

from chattts_operator.autoscaling import FleetSample, History, decide
from chattts_operator.autoscaling.decision import arrivals_by_service, learn_service_seconds
from chattts_operator.autoscaling.status import next_status
from tests.unit.autoscaling_support import LIMIT, NOW, SLOTS, autoscaling_spec

spec = partial(autoscaling_spec, 16)


def gauges(running: float, waiting: float, *, at: float = NOW, ready: int = 2, wait: float | None = None,
           observed: float | None = None) -> FleetSample:
    return FleetSample(time=at, wait_quantile=wait, observed_requests=observed, ready_replicas=ready,
                       requests_running=running, requests_waiting=waiting, slots_per_replica=SLOTS)


def series(points, **kwargs) -> list[FleetSample]:
    """(running, waiting) pairs 15 s apart, the newest at NOW."""
    n = len(points)
    return [gauges(r, w, at=NOW - 15.0 * (n - 1 - i), **kwargs) for i, (r, w) in enumerate(points)]


def test_no_wait_but_a_queue_grows_the_fleet_from_the_gauges():
    # Two full replicas, a queue building: the wait is above target whatever the histogram says.
    samples = series([(12, 0), (32, 6), (32, 20)])
    decision = decide(spec(), 2, samples, History(), NOW)
    assert decision.reason == "ScaleUp" and decision.desired_replicas > 2
    assert decision.metric_ok is False and decision.metric_value is None
    assert "decided from the queue gauges" in decision.message
    assert "request(s) waiting for a slot" in decision.message
    # The condition says the wait is missing, whatever was decided.
    status = next_status(None, decision, 2, NOW)
    active = next(c for c in status.conditions if c.type == "ScalingActive")
    assert active.status == "False" and active.reason == "InvalidMetric" and "queue gauges" in active.message


def test_no_wait_and_no_queue_never_scales_down():
    # Six replicas carrying two requests: with the wait it would shrink; without it, it holds.
    no_window = {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}
    samples = series([(2, 0)] * 5, ready=6)
    held = decide(spec(**no_window), 6, samples, History(), NOW)
    assert held.desired_replicas == 6 and held.reason == "HoldStable" and held.metric_ok is False
    known = [replace(s, wait_quantile=0.0, observed_requests=40.0) for s in samples]
    assert decide(spec(**no_window), 6, known, History(), NOW).desired_replicas < 6


def test_no_wait_sizes_for_the_load_in_flight():
    # 40 requests running on 3 replicas, nothing queued yet: the sizing alone asks for more.
    decision = decide(spec(), 3, series([(40, 0)] * 4, ready=3), History(), NOW)
    assert decision.desired_replicas >= 40 / LIMIT


def test_no_start_in_the_window_with_a_queue_is_not_idle():
    # A NaN wait over zero observations means idle only when nothing runs or waits.
    samples = series([(32, 10), (32, 20), (32, 30)], observed=0.0, wait=float("nan"))
    decision = decide(spec(), 2, samples, History(), NOW)
    assert decision.desired_replicas > 2 and decision.metric_ok is False


def test_the_service_time_is_learned_while_the_histogram_answers_and_sizes_the_arrivals():
    window = 60.0
    # 16 running, 32 starts in the window: each request runs 16 / (32 / 60) = 30 s.
    samples = [replace(s, observed_requests=32.0, wait_quantile=0.001) for s in series([(16, 0)] * 4)]
    assert learn_service_seconds(None, samples, window) == pytest.approx(30.0)
    assert learn_service_seconds(20.0, samples, window) == pytest.approx(0.8 * 20.0 + 0.2 * 30.0)
    assert learn_service_seconds(20.0, series([(16, 0)] * 4), window) == 20.0  # no start count: unchanged
    # The queue grows by 30 over 45 s (2/3 per second) on top of 32 running: 32 + 2/3 x 30 in flight.
    growing = series([(32, 0), (32, 10), (32, 20), (32, 30)])
    assert arrivals_by_service(growing, 30.0) == pytest.approx(52.0)
    assert arrivals_by_service(growing, None) is None


def test_through_a_cold_start_without_the_wait_the_arrivals_not_the_stuck_queue_size_the_fleet():
    # 2 Ready of 6, their queue grows by every arrival they cannot take: sizing for the queue
    # asks for more each evaluation; the arrivals by the learned service time do not.
    samples = series([(32, 10), (32, 30), (32, 50), (32, 70)], ready=2)
    with_service = decide(spec(), 6, samples, History(service_seconds=20.0), NOW)
    without = decide(spec(), 6, samples, History(), NOW)
    arrivals = 32 + (60 / 45) * 20.0
    assert with_service.raw_recommendation < without.raw_recommendation
    assert with_service.raw_recommendation <= -(-(arrivals + 1.5 * arrivals ** 0.5) // LIMIT)
    assert "Little's law" in with_service.message


def _after(samples, history=History(), current=2):
    """Decide at the newest sample (records the trend), then return the history."""
    return decide(spec(), current, samples, history, samples[-1].time).history


def test_a_gap_after_a_rising_trend_grows_for_it_one_window_ahead():
    rising = [replace(s, wait_quantile=0.001, observed_requests=50.0)
              for s in series([(8, 0), (8, 0), (10, 0), (20, 0)], ready=3)]
    history = _after(rising, current=3)
    assert history.trend is not None and history.trend[2] == pytest.approx(10 / 15)
    later = NOW + 150.0  # the newest sample is 2.5 min old: stale
    decision = decide(spec(), 3, rising, history, later)
    ahead = 20 + (10 / 15) * 60.0  # one window past the newest sample, no further
    assert decision.reason == "ScaleUp" and decision.metric_ok is False
    assert decision.raw_recommendation == -(-(ahead + 1.5 * ahead ** 0.5) // LIMIT)
    assert decision.desired_replicas == 7 and decision.limited_by == "ScaleUpPolicy"  # +4 per 15 s
    assert "rising before the gap" in decision.message and decision.metric_problem == "StaleMetric"
    # Recorded for the stabilization windows: the scale-down after the gap keeps it 360 s.
    assert decision.history.recommendations[-1] == (later, decision.raw_recommendation)


@pytest.mark.parametrize("points", [[(20, 0)] * 4, [(20, 0), (20, 0), (16, 0), (10, 0)]])
def test_a_gap_after_a_flat_or_falling_trend_holds_and_never_shrinks(points):
    samples = [replace(s, wait_quantile=0.001, observed_requests=50.0) for s in series(points, ready=8)]
    history = _after(samples, current=8)
    decision = decide(spec(), 8, samples, history, NOW + 150.0)
    assert decision.desired_replicas == 8 and decision.reason == "HoldStaleMetric"


def test_a_trend_older_than_staleness_and_a_window_is_not_extrapolated():
    rising = [replace(s, wait_quantile=0.001, observed_requests=50.0)
              for s in series([(8, 0), (8, 0), (10, 0), (20, 0)], ready=3)]
    history = _after(rising, current=3)
    assert decide(spec(), 3, rising, history, NOW + 200.0).reason == "HoldStaleMetric"


def test_the_trend_and_service_time_are_memory_only():
    # Not persisted in status: a History rebuilt from status compares equal without them.
    assert History(trend=(1.0, 2.0, 3.0, 4.0), service_seconds=5.0) == History()
