"""Second-round rules of the autoscaler (pure): scale-up sized for the deficit one evaluation
ahead, the demand record's quick-rebound test, and the deep-drop scale-down window."""
from __future__ import annotations

import math
from functools import partial

import pytest

from chattts_operator.autoscaling import DemandHistory, FleetSample, History, decide
from chattts_operator.autoscaling.decision import demand_ahead
from chattts_operator.autoscaling.status import next_status
from tests.unit.autoscaling_support import LIMIT, NOW, SLOTS, autoscaling_spec

MINUTE = 60.0
GUARD = 600.0

spec = partial(autoscaling_spec, 40)


def sample(at: float, running: float, waiting: float, *, ready: int, wait: float = 0.0) -> FleetSample:
    return FleetSample(time=at, wait_quantile=wait, observed_requests=100.0, ready_replicas=ready,
                       requests_running=running, requests_waiting=waiting, slots_per_replica=SLOTS)


# --- scale-up sized for the deficit one evaluation ahead -------------------------------------


def test_demand_ahead_extrapolates_the_newest_growth_only():
    grow = [sample(NOW - 15, 64, 20, ready=4), sample(NOW, 64, 60, ready=4)]
    assert demand_ahead(grow) == 124 + 40  # 64 + 60 now, and 40 more by the next evaluation
    shrink = [sample(NOW - 15, 64, 60, ready=4), sample(NOW, 64, 20, ready=4)]
    assert demand_ahead(shrink) == 84  # no growth: no extrapolation
    assert demand_ahead(shrink[-1:]) == 84
    assert demand_ahead([]) == 0.0


def test_a_growing_deficit_scales_up_for_the_queue_of_the_next_evaluation():
    """4 full replicas, the queue 20 -> 60 in 15 s, wait far above target: without the
    extrapolation the step would be for the 124 seen (a second step, a second cold start,
    follows 15 s later); with it the first step covers the 164 the next evaluation will see."""
    over = [sample(NOW - 30 + 15 * i, 64, q, ready=4, wait=2.0) for i, q in enumerate((0, 20, 60))]
    up = decide(spec(), 4, over, History(), NOW)
    assert up.raw_recommendation == math.ceil(164 / LIMIT)
    steady = [sample(NOW - 30 + 15 * i, 64, 60, ready=4, wait=2.0) for i in range(3)]
    assert decide(spec(), 4, steady, History(), NOW).raw_recommendation == math.ceil(124 / LIMIT)
    # The rate policies still apply: double or +4 per 15 s from 4 is 8.
    assert up.desired_replicas == 8 and up.limited_by == "ScaleUpPolicy"


def test_below_target_no_extrapolation_is_added():
    calm = [sample(NOW - 15, 10, 0, ready=4), sample(NOW, 20, 0, ready=4)]
    assert decide(spec(), 4, calm, History(), NOW).raw_recommendation == 4


# --- the demand record's quick-rebound test ---------------------------------------------------


def record(needed_per_minute: list[int], end: float = NOW) -> DemandHistory:
    """One entry per minute, the last at ``end``'s minute."""
    history = DemandHistory()
    first = end - MINUTE * (len(needed_per_minute) - 1)
    for i, n in enumerate(needed_per_minute):
        history.record(first + MINUTE * i, n)
    return history


def test_unknown_until_the_record_covers_the_lookback():
    assert record([8] * 30).quick_rebound(NOW, GUARD) is None
    assert DemandHistory().quick_rebound(NOW, GUARD) is None
    assert record([8] * 70).quick_rebound(NOW, GUARD) is False


def test_a_deep_dip_that_came_back_within_the_guard_is_a_quick_rebound():
    square = ([8] * 5 + [3] * 5) * 7  # halves of 5 minutes: down to under half, back 5 minutes later
    assert record(square).quick_rebound(NOW, GUARD) is True


def test_noise_and_a_drop_that_stays_down_are_not_rebounds():
    noisy = [8, 7, 6, 8, 7, 8, 6, 7] * 9  # 8 -> 6 and back is a quarter, not a deep dip
    assert record(noisy).quick_rebound(NOW, GUARD) is False
    crowd_over = [1] * 30 + [10] * 35 + [2] * 5  # the crowd left 5 minutes ago: nothing came back
    assert record(crowd_over).quick_rebound(NOW, GUARD) is False
    slow_return = [8] * 20 + [3] * 15 + [8] * 35  # back after 15 minutes: beyond the guard
    assert record(slow_return).quick_rebound(NOW, GUARD) is False


# --- the deep-drop scale-down window -----------------------------------------------------------


def after_a_drop(recommended_before: int) -> tuple[History, list[FleetSample]]:
    """The last 5 minutes recommended ``recommended_before``; the load now asks for 2."""
    history = History(recommendations=tuple((NOW - 300 + 15 * i, recommended_before) for i in range(16)))
    low = [sample(NOW - 45 + 15 * i, 6, 0, ready=10) for i in range(4)]
    return history, low


def test_a_deep_drop_without_quick_rebounds_scales_down_after_the_deep_drop_window():
    history, low = after_a_drop(10)
    history = History(recommendations=history.recommendations[:-4] + tuple((NOW - 45 + 15 * i, 2) for i in range(3)))
    down = decide(spec(), 10, low, history, NOW, quick_rebound=False)
    assert down.desired_replicas == down.raw_recommendation < 5, down.message
    assert "deep drop" in down.message and "scale-down window 1m" in down.message
    # Status says why: the decision record carries the reason and the rule that allowed it.
    [record] = next_status(None, down, 10, NOW).decisions
    assert record.reason == "ScaleDown" and "deep drop" in record.message
    # The same drop where the last hour's load came back quickly, or nothing is known: 360 s.
    for rebound in (True, None):
        held = decide(spec(), 10, low, history, NOW, quick_rebound=rebound)
        assert held.desired_replicas == 10 and held.limited_by == "Stabilized"


def test_a_shallow_drop_keeps_the_long_window():
    """From 10 to 6 is no deep drop (more than half remains): the 360 s window holds."""
    history = History(recommendations=tuple((NOW - 300 + 15 * i, 10) for i in range(17)))
    moderate = [sample(NOW - 45 + 15 * i, 33, 0, ready=10) for i in range(4)]
    held = decide(spec(), 10, moderate, history, NOW, quick_rebound=False)
    assert 5 < held.raw_recommendation < 10
    assert held.desired_replicas == 10 and held.limited_by == "Stabilized"


def test_the_deep_drop_window_never_lengthens_the_scale_down_window():
    history, low = after_a_drop(10)
    quick = spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}, deepDropWindow="5m")
    assert decide(quick, 10, low, history, NOW, quick_rebound=False).desired_replicas < 5


def test_deep_drop_window_validation():
    assert spec().deep_drop_window_seconds == 60.0
    assert spec(deepDropWindow="6m").deep_drop_window_seconds == 360.0
    with pytest.raises(ValueError):
        spec(deepDropWindow="soon")
