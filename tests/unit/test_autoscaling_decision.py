"""Table-driven tests of the pure autoscaling decision (no I/O, time injected)."""
from __future__ import annotations

import math
from functools import partial

import pytest

from chattts_operator.api.autoscaling import AutoscalingSpec
from chattts_operator.autoscaling import FleetSample, History, decide, per_replica_load_limit
from chattts_operator.autoscaling.decision import fleet_demand, growth_headroom
from tests.unit.autoscaling_support import LIMIT, NOW, SLOTS, autoscaling_spec

spec = partial(autoscaling_spec, 10)


def sample(
    wait: float | None = 0.001,
    running: float | None = 8.0,
    waiting: float | None = 0.0,
    *,
    age: float = 0.0,
    ready: int = 2,
    unreachable: int = 0,
    observed: float | None = 100.0,
    slots: float | None = SLOTS,
) -> FleetSample:
    return FleetSample(
        time=NOW - age, wait_quantile=wait, observed_requests=observed, ready_replicas=ready,
        unreachable_replicas=unreachable, requests_running=running, requests_waiting=waiting,
        slots_per_replica=slots,
    )


def steady(n: int = 4, **kwargs) -> list[FleetSample]:
    """n samples 15 s apart, the newest at NOW."""
    return [
        FleetSample(**{**sample(**kwargs).__dict__, "time": NOW - 15.0 * (n - 1 - i)}) for i in range(n)
    ]


# --- the load limit -------------------------------------------------------------------


@pytest.mark.parametrize("slots", [1, 4, 16, 64, 256, 4096])
def test_load_limit_keeps_the_poisson_tail_below_one_minus_quantile(slots):
    x = per_replica_load_limit(slots, 0.99)
    tail = 1.0 - sum(math.exp(k * math.log(x) - x - math.lgamma(k + 1)) for k in range(slots))
    assert 0 < x < slots
    assert tail == pytest.approx(0.01, abs=1e-6)


def test_load_limit_grows_with_a_looser_quantile():
    assert per_replica_load_limit(16, 0.9) > per_replica_load_limit(16, 0.99) > per_replica_load_limit(16, 0.999)


@pytest.mark.parametrize("slots,quantile", [(0, 0.99), (-3, 0.99), (16, 0.0), (16, 1.0)])
def test_load_limit_rejects_bad_input(slots, quantile):
    with pytest.raises(ValueError):
        per_replica_load_limit(slots, quantile)


# --- missing, stale, NaN with nothing else known: hold ----------------------------------------------------------


@pytest.mark.parametrize(
    "samples,current,reason",
    [
        ([], 3, "HoldMissingMetric"),
        ([sample(age=121.0)], 3, "HoldStaleMetric"),  # staleness 2m
        ([sample(age=-30.0)], 3, "HoldStaleMetric"),  # from the future: clock skew
        # No wait and no queue gauges either: nothing is known (with the gauges: see below).
        ([sample(wait=float("nan"), running=None)], 3, "HoldInvalidMetric"),
        ([sample(wait=None, waiting=None)], 3, "HoldInvalidMetric"),
        ([sample(wait=None, slots=None)], 3, "HoldInvalidMetric"),
        ([sample(wait=-0.001)], 3, "HoldInvalidMetric"),
        ([sample(wait=float("inf"), running=None)], 3, "HoldInvalidMetric"),
        # NaN with an unknown request count (a Prometheus query): cannot tell idle from broken.
        ([sample(wait=float("nan"), observed=None, running=None, waiting=None)], 3, "HoldInvalidMetric"),
    ],
)
def test_bad_metrics_hold_replicas(samples, current, reason):
    decision = decide(spec(), current, samples, History(), NOW)
    assert decision.desired_replicas == current
    assert decision.reason == reason
    assert decision.metric_ok is False
    assert decision.raw_recommendation is None
    assert decision.history.recommendations == ()  # a hold is no evidence for stabilization


def test_stale_metrics_never_scale_down_even_far_above_need():
    # Ten replicas, an hour-old sample that said "idle": hold, do not shrink.
    decision = decide(spec(), 10, [sample(wait=0.0, running=0, age=3600)], History(), NOW)
    assert decision.desired_replicas == 10


@pytest.mark.parametrize(
    "current,cap,expected,limited_by",
    [(0, None, 1, "MinReplicas"), (12, None, 10, "MaxReplicas"), (8, 5, 5, "GPUShare")],
)
def test_hold_still_applies_bounds(current, cap, expected, limited_by):
    decision = decide(spec(), current, [], History(), NOW, cap=cap)
    assert decision.desired_replicas == expected
    assert decision.limited_by == limited_by
    assert decision.metric_ok is False


def test_nan_wait_with_zero_observed_requests_is_idle_not_missing():
    samples = steady(wait=float("nan"), observed=0.0, running=0.0, waiting=0.0)
    decision = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 4, samples, History(), NOW)
    assert decision.metric_ok is True
    assert decision.desired_replicas == 1


def test_unreachable_pods_block_scale_down_but_not_scale_up():
    down = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 6,
                  steady(running=4.0, unreachable=1), History(), NOW)
    assert down.desired_replicas == 6
    assert "did not answer" in down.message
    up = decide(spec(), 2, steady(running=40.0, ready=2, unreachable=1), History(), NOW)
    assert up.desired_replicas > 2


# --- sizing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "demand,current,expected",
    [
        (4.0, 1, 1),  # 4 + 1.5 sigma = 7.0 fits one replica (8.18)
        (5.0, 1, 2),  # 5 + 1.5 sigma = 8.35 does not: a second replica before a rise
        (8.0, 1, 2),  # 8 < 8.18 fits one replica, not with 1.5 sigma of its noise (12.2)
        (9.0, 1, 2),
        (40.0, 2, 6),  # needs 5, room for 49.5 asks 7, one spare at most: 6 (the policy allows 6)
        (40.0, 5, 6),
        (80.0, 5, 10),  # needs 10, room 12, one spare: 11; policy: 5 + max(5, 4) = 10
    ],
)
def test_scale_up_follows_demand_plus_noise_over_the_per_replica_limit(demand, current, expected):
    needed = math.ceil(demand / LIMIT)
    grown = max(needed, min(math.ceil(growth_headroom(demand) / LIMIT), needed + 1))
    decision = decide(spec(), current, steady(running=demand, ready=current), History(), NOW)
    assert decision.desired_replicas == min(max(grown, current), 10, current + max(current, 4))
    assert decision.desired_replicas == expected
    assert decision.sized == max(needed, 1)  # the forecast records what the load needs, no margin
    if expected != current:
        assert decision.reason == "ScaleUp"


def test_wait_above_target_grows_even_when_the_sizing_says_enough():
    # The slots figure is wrong (say the KV cache admits fewer): the wait decides.
    samples = steady(wait=0.050, running=10.0, waiting=5.0, ready=3)
    decision = decide(spec(), 3, samples, History(), NOW)
    assert decision.reason == "ScaleUp"
    assert decision.desired_replicas >= math.ceil(3 * 15.0 / 10.0)


def test_wait_above_target_does_not_pile_up_while_replicas_start():
    # 5 replicas asked, 3 ready; 40 in flight need 5: the ones starting are enough.
    samples = steady(wait=0.050, running=30.0, waiting=10.0, ready=3)
    decision = decide(spec(), 5, samples, History(), NOW)
    assert decision.desired_replicas == 5


def test_wait_above_target_never_scales_down():
    samples = steady(wait=0.050, running=1.0, waiting=0.0, ready=6)
    decision = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 6, samples, History(), NOW)
    assert decision.desired_replicas >= 6


def test_near_target_wait_blocks_scale_down():
    samples = steady(wait=0.0048, running=4.0, waiting=0.0, ready=6)  # within tolerance of 5 ms
    decision = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 6, samples, History(), NOW)
    assert decision.desired_replicas == 6


def test_shrink_needs_room_for_noise_and_the_tolerance_band():
    # 3 replicas carry 24.5 in flight. Demand 20 fits, but not with 3.5 sigma of Poisson noise
    # and the 10% band ((20 + 3.5 * sqrt(20)) * 1.1 = 39.2): stay at 4. Demand 10 leaves room (23.2);
    # 11 does not any more (24.9).
    no_margin = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 4,
                       steady(running=20.0, ready=4), History(), NOW)
    assert no_margin.desired_replicas == 4
    with_margin = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 4,
                         steady(running=10.0, ready=4), History(), NOW)
    assert with_margin.desired_replicas == 3
    just_short = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 4,
                        steady(running=11.0, ready=4), History(), NOW)
    assert just_short.desired_replicas == 4


def test_noise_in_one_sample_does_not_scale_up_but_a_sustained_burst_does():
    calm = steady(running=10.0, ready=2)  # 10 + 1.5 sigma = 14.7: two replicas (16.4) carry it
    noisy = calm[:-1] + [FleetSample(**{**calm[-1].__dict__, "requests_running": 14.0})]
    assert decide(spec(), 2, noisy, History(), NOW).desired_replicas == 2
    burst = calm[:-2] + [FleetSample(**{**x.__dict__, "requests_running": 45.0}) for x in calm[-2:]]
    # Grown for 45 + 1.5 sigma (7 replicas), as far as the scale-up policy allows from 2 (+4).
    assert decide(spec(), 2, burst, History(), NOW).desired_replicas == min(math.ceil(growth_headroom(45.0) / LIMIT), 6)


@pytest.mark.parametrize(
    "values,expected",
    [
        ([10.0, 10.0, 10.0, 10.0], (10.0, 10.0)),
        ([8.0, 12.0, 8.0, 12.0], (10.0, 12.0)),
        ([10.0, 10.0, 10.0, 30.0], (15.0, 30.0)),  # one high sample: noise
        ([10.0, 10.0, 30.0, 32.0], (30.0, 30.0)),  # two beyond 3 sigma of the older ones: a burst
    ],
)
def test_fleet_demand_low_high(values, expected):
    samples = [sample(running=v) for v in values]
    assert fleet_demand(samples) == pytest.approx(expected)


def test_fleet_demand_unknown_without_queue_gauges():
    assert fleet_demand([sample(running=None)]) is None
    assert fleet_demand([sample(waiting=float("nan"))]) is None


# --- HPA semantics: fallback without queue metrics, stabilization, policies -------------


@pytest.mark.parametrize(
    "wait,current,expected",
    [
        (0.005, 4, 4),  # at target
        (0.0054, 4, 4),  # within 10% tolerance
        (0.010, 4, 8),  # ceil(4 * 2)
        (0.0075, 3, 5),  # ceil(3 * 1.5)
        (0.100, 2, 6),  # ceil(2 * 20) = 40, limited to 2 + max(2, 4) per 15 s
    ],
)
def test_without_queue_gauges_the_hpa_ratio_applies(wait, current, expected):
    samples = steady(wait=wait, running=None, waiting=None, ready=current, slots=None)
    assert decide(spec(), current, samples, History(), NOW).desired_replicas == expected


def test_scale_down_stabilization_takes_the_highest_recent_recommendation():
    history = History(recommendations=((NOW - 200, 6), (NOW - 100, 5)))
    samples = steady(wait=0.0, running=0.0, ready=6)
    decision = decide(spec(), 6, samples, history, NOW)
    assert decision.desired_replicas == 6
    assert decision.limited_by == "Stabilized"
    # 161 s later the 6 has left the 360 s window; the 5 has not.
    later_samples = [FleetSample(**{**x.__dict__, "time": x.time + 161}) for x in samples]
    later = decide(spec(), 6, later_samples, history, NOW + 161)
    assert later.desired_replicas == 5


def test_scale_up_stabilization_takes_the_lowest_recent_recommendation():
    s = spec(behavior={"scaleUp": {"stabilizationWindowSeconds": 60,
                                   "policies": [{"type": "Pods", "value": 100, "periodSeconds": 15}]}})
    history = History(recommendations=((NOW - 30, 3),))
    decision = decide(s, 2, steady(running=80.0, ready=2), history, NOW)
    assert decision.desired_replicas == 3


@pytest.mark.parametrize(
    "policies,select,events,current,expected",
    [
        ([{"type": "Pods", "value": 1, "periodSeconds": 60}], "Max", (), 2, 3),
        ([{"type": "Pods", "value": 1, "periodSeconds": 60}], "Max", ((NOW - 30, 1),), 3, 3),  # used up
        ([{"type": "Pods", "value": 1, "periodSeconds": 60}], "Max", ((NOW - 61, 1),), 3, 4),  # period over
        ([{"type": "Percent", "value": 50, "periodSeconds": 15}], "Max", (), 4, 6),
        ([{"type": "Percent", "value": 50, "periodSeconds": 15},
          {"type": "Pods", "value": 1, "periodSeconds": 15}], "Min", (), 4, 5),
        ([{"type": "Pods", "value": 4, "periodSeconds": 15}], "Disabled", (), 4, 4),
    ],
)
def test_scale_up_policies(policies, select, events, current, expected):
    s = spec(behavior={"scaleUp": {"policies": policies, "selectPolicy": select}})
    decision = decide(s, current, steady(running=80.0, ready=current), History(scale_events=events), NOW)
    assert decision.desired_replicas == expected


@pytest.mark.parametrize(
    "policies,events,current,expected",
    [
        ([{"type": "Pods", "value": 1, "periodSeconds": 60}], (), 8, 7),
        ([{"type": "Pods", "value": 1, "periodSeconds": 60}], ((NOW - 10, -1),), 7, 7),
        ([{"type": "Percent", "value": 50, "periodSeconds": 60}], (), 8, 4),
        # 2 removed 10 s ago: the period started at 8, so 3 per 60 s allows down to 5.
        ([{"type": "Pods", "value": 3, "periodSeconds": 60}], ((NOW - 10, -2),), 6, 5),
    ],
)
def test_scale_down_policies(policies, events, current, expected):
    s = spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0, "policies": policies}})
    decision = decide(s, current, steady(wait=0.0, running=0.0, ready=current), History(scale_events=events), NOW)
    assert decision.desired_replicas == expected


def test_gpu_share_cap_clamps_and_says_so():
    decision = decide(spec(), 2, steady(running=80.0, ready=2), History(), NOW, cap=3)
    assert decision.desired_replicas == 3
    assert decision.limited_by == "GPUShare"


def test_cap_below_min_wins():
    decision = decide(spec(minReplicas=4), 4, steady(running=10.0, ready=4), History(), NOW, cap=2)
    assert decision.desired_replicas == 2


def test_history_is_pruned_and_recorded():
    old = History(recommendations=((NOW - 10_000, 9),), scale_events=((NOW - 10_000, 3),))
    decision = decide(spec(), 2, steady(running=40.0, ready=2), old, NOW)
    assert decision.history.recommendations == ((NOW, decision.raw_recommendation),)
    assert decision.history.scale_events == ((NOW, decision.desired_replicas - 2),)


def test_decide_rejects_bad_arguments():
    with pytest.raises(ValueError):
        decide(spec(), -1, [], History(), NOW)
    with pytest.raises(ValueError):
        decide(AutoscalingSpec(), 1, [], History(), NOW)  # disabled spec without maxReplicas


def test_steady_load_makes_no_change_over_an_hour():
    """Replaying a constant load for an hour: the decision never moves (no flapping)."""
    s = spec()
    history, current, samples = History(), 4, []  # 4 carry 18 + 1.5 sigma (24.4 > 3 x 8.18)
    changes = 0
    for i in range(240):
        now = NOW + 15.0 * i
        running = 18.0 + (1.5 if i % 2 else -1.5)  # noise around 18 in flight
        samples = [x for x in samples if now - x.time <= 60] + [
            FleetSample(time=now, wait_quantile=0.002, observed_requests=200, ready_replicas=current,
                        requests_running=running, requests_waiting=0.0, slots_per_replica=SLOTS)
        ]
        decision = decide(s, current, samples, history, now)
        history = decision.history
        changes += decision.desired_replicas != current
        current = decision.desired_replicas
    assert changes == 0
    assert current == 4
