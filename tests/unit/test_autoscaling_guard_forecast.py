"""The capacity signal, the reversal guard and the forecast floor (pure), their status
round-trip, the frame counter's reading, and the exporters of the operator's metrics."""
from __future__ import annotations

import math
from functools import partial

import pytest

from chattts_operator.api.autoscaling import AutoscalingSpec, ForecastSpec
from chattts_operator.autoscaling import DemandHistory, FleetSample, History, decide
from chattts_operator.autoscaling.decision import fleet_work, learn_step_seconds
from chattts_operator.autoscaling.signals import PodScrape, fleet_sample, parse_pod_metrics
from chattts_operator.autoscaling.status import history_from_status, next_status
from chattts_operator.core.metrics import AUTOSCALER, REGISTRY, SHARE_POLICIES
from tests.unit.autoscaling_support import LIMIT, NOW, SLOTS, autoscaling_spec

DAY = 86400.0

spec = partial(autoscaling_spec, 10)


def window(running: float, ready: int, *, fps: float | None = None, wait: float = 0.0, observed: float = 100.0,
           waiting: float = 0.0, at: float = NOW, n: int = 4) -> list[FleetSample]:
    """n samples 15 s apart ending at ``at``."""
    return [FleetSample(time=at - 15.0 * (n - 1 - i), wait_quantile=wait, observed_requests=observed,
                        ready_replicas=ready, requests_running=running, requests_waiting=waiting,
                        slots_per_replica=SLOTS, frames_per_second=fps) for i in range(n)]


# --- the capacity signal ---------------------------------------------------------------


def test_the_capacity_signal_reads_the_same_load_at_batch_1_and_16():
    """One replica serving 400 frames/s: at batch 1 (2.5 ms steps) one request is in flight,
    at batch 16 on an engine whose steps grew to 40 ms, 16 are. Frames/s x the step time at
    the limit reads the same work either way; requests in flight differ 16x."""
    step_at_limit = 0.02
    light = fleet_work(window(1.0, 1, fps=400.0), step_at_limit)
    heavy = fleet_work(window(16.0, 1, fps=400.0), step_at_limit)
    assert light == heavy == (pytest.approx(8.0), pytest.approx(8.0))


def test_the_step_time_is_learned_near_the_load_limit_only():
    busy = window(running=0.8 * LIMIT * 4, ready=4, fps=0.8 * LIMIT * 4 / 0.03)
    assert learn_step_seconds(None, busy, LIMIT) == pytest.approx(0.03)
    assert learn_step_seconds(0.02, busy, LIMIT) == pytest.approx(0.8 * 0.02 + 0.2 * 0.03)
    light = window(running=1.0, ready=4, fps=1.0 / 0.005)  # batch 1/4: a step far shorter than at the limit
    assert learn_step_seconds(0.03, light, LIMIT) == 0.03
    assert learn_step_seconds(None, window(running=30.0, ready=4, fps=None), LIMIT) is None


def test_scale_down_follows_the_capacity_signal_not_requests_in_flight():
    """6 lightly loaded replicas (short steps), 30 requests in flight: with room for noise
    in-flight counts keep all 6. The frame rate says the work is that of 10 requests at the
    limit's step time: shrink, but never below the 4 the 30 in flight ask for at once."""
    down_now = spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    by_flight = decide(down_now, 6, window(running=30.0, ready=6), History(step_seconds=0.03), NOW)
    assert by_flight.desired_replicas == 6
    by_work = decide(down_now, 6, window(running=30.0, ready=6, fps=10.0 / 0.03), History(step_seconds=0.03), NOW)
    assert by_work.desired_replicas == 4, by_work.message
    assert "load at the limit's step time" in by_work.message
    assert by_work.history.step_seconds == 0.03  # 5 per replica is below 3/4 of the limit: nothing learned


# --- the reversal guard ----------------------------------------------------------------


def test_no_scale_down_within_the_guard_of_a_scale_up():
    calm = window(running=5.0, ready=6)
    after_up = History(last_scale_up=NOW - 300.0)
    held = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 6, calm, after_up, NOW)
    assert held.desired_replicas == 6 and held.limited_by == "ReversalGuard"
    assert "no scale-down within 10m" in held.message
    later = History(last_scale_up=NOW - 601.0)
    free = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 6, calm, later, NOW)
    assert free.desired_replicas < 6 and free.limited_by == ""


def test_idle_replicas_scale_down_even_within_the_guard():
    idle = window(running=0.0, ready=6, observed=0.0)
    decision = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 6, idle,
                      History(last_scale_up=NOW - 60.0), NOW)
    assert decision.desired_replicas == 1


def test_a_scale_up_starts_the_guard_clock_and_status_keeps_it():
    busy = window(running=40.0, ready=2, wait=0.5, waiting=10.0)
    up = decide(spec(), 2, busy, History(step_seconds=0.025), NOW)
    assert up.desired_replicas > 2 and up.history.last_scale_up == NOW
    status = next_status(None, up, 2, NOW)
    assert status.last_scale_up_time is not None and status.step_time == "25ms"
    assert history_from_status(status).last_scale_up == NOW
    assert history_from_status(status).step_seconds == pytest.approx(0.025)
    # A failed scale write did not add replicas: the clock stays where it was.
    failed = next_status(None, up, 2, NOW, scale_error="409 Conflict")
    assert failed.last_scale_up_time is None


def test_a_partial_window_never_scales_down():
    one = window(running=5.0, ready=6, n=1)
    decision = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 6, one, History(), NOW)
    assert decision.desired_replicas == 6 and "less than half the window" in decision.message


# --- the forecast floor ----------------------------------------------------------------


def test_the_floor_is_what_the_same_stretch_needed_a_period_ago_lead_early():
    record = DemandHistory()
    forecast = ForecastSpec()  # lead 5m, period 24h
    for minute in range(24 * 60 + 30):
        t = minute * 60.0
        # A rise at 09:00 every day: 2 replicas before, 8 from 09:00 to 10:00.
        record.record(t, 8 if 9 * 60 <= minute % 1440 < 10 * 60 else 2)
    assert record.floor(DAY - 1.0, forecast) is None or record.floor(DAY - 1.0, forecast) <= 2
    before_rise = DAY + 9 * 3600 - 240.0  # 08:56 the next day: the rise is within the lead
    assert record.floor(before_rise, forecast) == 8
    assert record.floor(DAY + 8 * 3600, forecast) == 2


def test_no_floor_until_the_record_reaches_back_a_period():
    record = DemandHistory()
    record.record(NOW, 5)
    assert record.floor(NOW + 3600.0, ForecastSpec()) is None


def test_the_record_keeps_one_period_and_the_most_of_each_minute():
    record = DemandHistory()
    record.record(0.0, 3)
    record.record(10.0, 5)
    record.record(20.0, 4)
    assert record.minutes == {0: 5}
    record.record(2 * DAY, 1, keep=DAY)
    assert 0 not in record.minutes


def test_the_floor_raises_replicas_bounded_by_max_and_the_share_cap():
    calm = window(running=4.0, ready=2)
    raised = decide(spec(), 2, calm, History(), NOW, floor=6)
    assert raised.desired_replicas == 6 and raised.limited_by == "ForecastFloor"
    assert raised.reason == "ScaleUpForecast" and "forecast floor 6" in raised.message
    assert raised.forecast_floor == 6
    assert decide(spec(), 2, calm, History(), NOW, floor=50).desired_replicas == 10
    capped = decide(spec(), 2, calm, History(), NOW, cap=4, floor=6)
    assert capped.desired_replicas == 4 and capped.forecast_floor == 4
    assert decide(spec(), 2, calm, History(), NOW, floor=1).forecast_floor is None


def test_forecast_spec_validation():
    with pytest.raises(ValueError, match="lead"):
        AutoscalingSpec.model_validate({"forecast": {"lead": "10s"}})
    with pytest.raises(ValueError, match="reversalGuard"):
        AutoscalingSpec.model_validate({"reversalGuard": "ten minutes"})


# --- the frame counter -----------------------------------------------------------------


METRICS = """# TYPE vllm:scheduler_deadline_wait_seconds histogram
vllm:scheduler_deadline_wait_seconds_bucket{{le="0.005"}} {n}
vllm:scheduler_deadline_wait_seconds_bucket{{le="+Inf"}} {n}
vllm:scheduler_deadline_wait_seconds_count {n}
vllm:scheduler_deadline_wait_seconds_sum 0
# TYPE chattts_batch_size histogram
chattts_batch_size_bucket{{le="+Inf"}} 10
chattts_batch_size_count 10
chattts_batch_size_sum {frames}
chattts_requests_running 4
chattts_requests_waiting 0
"""


def test_frames_per_second_come_from_the_batch_size_sum_across_pods():
    a = [parse_pod_metrics(METRICS.format(n=1, frames=1000), 0.0), parse_pod_metrics(METRICS.format(n=5, frames=7000), 30.0)]
    b = [parse_pod_metrics(METRICS.format(n=1, frames=50), 0.0), parse_pod_metrics(METRICS.format(n=2, frames=3050), 30.0)]
    assert a[0].frames == 1000
    sample = fleet_sample({"a": a, "b": b}, 30.0, 60.0, 0.99, 0, SLOTS)
    assert sample.frames_per_second == pytest.approx(6000 / 30 + 3000 / 30)


def test_without_the_frame_counter_the_rate_is_unknown():
    scrapes = [PodScrape(0.0, ((math.inf, 1.0),), 1.0, 1.0, 0.0), PodScrape(30.0, ((math.inf, 3.0),), 3.0, 1.0, 0.0)]
    assert fleet_sample({"a": scrapes}, 30.0, 60.0, 0.99, 0, SLOTS).frames_per_second is None


# --- the exporters ---------------------------------------------------------------------


def test_autoscaler_metrics_follow_decisions_and_go_with_the_object():
    labels = {"chattts_namespace": "ns-metrics", "chattts_deployment": "tts"}
    AUTOSCALER.observe("ns-metrics", "tts", desired=5, current=3, sized=4, wait=0.012, target=0.005, floor=5,
                       reason="ScaleUpForecast", limited_by="ForecastFloor")
    assert REGISTRY.get_sample_value("chattts_autoscaler_desired_replicas", labels) == 5
    assert REGISTRY.get_sample_value("chattts_autoscaler_forecast_floor_replicas", labels) == 5
    assert REGISTRY.get_sample_value("chattts_autoscaler_wait_seconds", labels) == 0.012
    assert REGISTRY.get_sample_value("chattts_autoscaler_decisions_total",
                                     {**labels, "reason": "ScaleUpForecast", "limited_by": "ForecastFloor"}) == 1
    AUTOSCALER.observe("ns-metrics", "tts", desired=5, current=5, sized=None, wait=None, target=0.005, floor=None,
                       reason="HoldStaleMetric", limited_by="")
    assert REGISTRY.get_sample_value("chattts_autoscaler_wait_seconds", labels) is None  # unknown, not stale
    assert REGISTRY.get_sample_value("chattts_autoscaler_forecast_floor_replicas", labels) == 0
    AUTOSCALER.forget("ns-metrics", "tts")
    assert REGISTRY.get_sample_value("chattts_autoscaler_desired_replicas", labels) is None
    assert REGISTRY.get_sample_value("chattts_autoscaler_decisions_total",
                                     {**labels, "reason": "HoldStaleMetric", "limited_by": "none"}) is None


def test_share_policy_metrics_follow_the_window_and_job_states():
    status = {"window": "night", "shares": {"online": 30, "offline": 70}, "pool": {"gpuMemoryMiB": 143360},
              "used": {"onlineMiB": 40960, "offlineMiB": 81920}}
    SHARE_POLICIES.observe("p-metrics", status, ["Running", "Suspended", "Running"])
    get = REGISTRY.get_sample_value
    assert get("chattts_sharepolicy_window_info", {"policy": "p-metrics", "window": "night"}) == 1
    assert get("chattts_sharepolicy_share_ratio", {"policy": "p-metrics", "class": "offline"}) == 0.7
    assert get("chattts_sharepolicy_used_mebibytes", {"policy": "p-metrics", "class": "online"}) == 40960
    assert get("chattts_sharepolicy_pool_mebibytes", {"policy": "p-metrics"}) == 143360
    assert get("chattts_sharepolicy_offline_jobs", {"policy": "p-metrics", "state": "Running"}) == 2
    SHARE_POLICIES.observe("p-metrics", {**status, "window": None, "shares": {"online": 100, "offline": 0}}, [],
                           wrote_status=True)
    assert get("chattts_sharepolicy_window_info", {"policy": "p-metrics", "window": "night"}) is None
    assert get("chattts_sharepolicy_window_info", {"policy": "p-metrics", "window": "default"}) == 1
    assert get("chattts_sharepolicy_offline_jobs", {"policy": "p-metrics", "state": "Running"}) is None
    # Counters survive the gauges' reset of every pass: two passes, one of which wrote.
    assert get("chattts_sharepolicy_passes_total", {"policy": "p-metrics"}) == 2
    assert get("chattts_sharepolicy_status_writes_total", {"policy": "p-metrics"}) == 1
    SHARE_POLICIES.forget("p-metrics")
    assert get("chattts_sharepolicy_pool_mebibytes", {"policy": "p-metrics"}) is None
    assert get("chattts_sharepolicy_passes_total", {"policy": "p-metrics"}) is None


def test_idle_replicas_with_few_slots_go_back_to_min():
    """Noise room is that of the load itself: an idle fleet needs none, even when one
    replica's load limit is a fraction of a request (2 slots at p99)."""
    idle = [FleetSample(**{**s.__dict__, "slots_per_replica": 2.0}) for s in window(running=0.0, ready=3, observed=0.0)]
    decision = decide(spec(maxReplicas=3, behavior={"scaleDown": {"stabilizationWindowSeconds": 15}}), 3, idle,
                      History(last_scale_up=NOW - 30.0, step_seconds=0.01), NOW)
    assert decision.desired_replicas == 1
