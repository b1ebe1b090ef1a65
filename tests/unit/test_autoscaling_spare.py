"""Fourth-round rules of the autoscaler (pure): growth leaves room for noise, so a fleet at a low
load holds a second replica before a rise; a drop of one replica is never a deep drop."""
from __future__ import annotations

import math
from functools import partial

from chattts_operator.autoscaling import FleetSample, History, decide
from chattts_operator.autoscaling.decision import GROWTH_SIGMAS, growth_headroom, shrink_headroom
from tests.unit.autoscaling_support import NOW, SLOTS, autoscaling_spec

spec = partial(autoscaling_spec, 16)


def window(running: float, ready: int, n: int = 4, at: float = NOW) -> list[FleetSample]:
    return [FleetSample(time=at - 15.0 * (n - 1 - i), wait_quantile=0.002, observed_requests=100.0,
                        ready_replicas=ready, requests_running=running, requests_waiting=0.0,
                        slots_per_replica=SLOTS) for i in range(n)]


def test_growth_leaves_room_for_one_and_a_half_sigma_of_noise():
    assert GROWTH_SIGMAS == 1.5
    assert growth_headroom(16.0) == 16.0 + 1.5 * 4.0
    assert growth_headroom(0.0) == 0.0
    # Growth keeps less room than shrinking: the band between them is the hysteresis.
    for level in (1.0, 4.0, 25.0, 100.0):
        assert growth_headroom(level) < shrink_headroom(level)


def test_a_single_replica_at_the_crowd_base_load_grows_a_spare_and_records_what_the_load_needs():
    """The crowd's base load on the anchor: ~4.25 requests in flight, sized for 1 replica (8.18
    carries it). With 1.5 sigma of room (7.3) one still does; at 5 in flight (8.35) it does not,
    and the spare is added before any rise, the reason said in the message."""
    assert decide(spec(), 1, window(4.25, 1), History(), NOW).desired_replicas == 1
    up = decide(spec(), 1, window(5.0, 1), History(), NOW)
    assert up.desired_replicas == 2 and up.reason == "ScaleUp"
    assert "room for 1.5 sigma of noise" in up.message
    assert up.sized == 1  # the forecast floor records the load's need, not the margin


def test_the_spare_is_kept_the_band_between_growth_and_shrink_holds_it():
    """Two replicas at the level that grew the spare: shrinking needs 3 sigma and the 10%
    tolerance to fit one replica ((5 + 6.7) * 1.1 = 12.9 > 8.18): held, no reversal."""
    held = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 2, window(5.0, 2),
                  History(), NOW)
    assert held.desired_replicas == 2 and held.reason == "HoldStable"
    # Idle-low load does give the spare back (1 in flight: (1 + 3) * 1.1 = 4.4 fits one).
    down = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 2, window(1.0, 2),
                  History(), NOW)
    assert down.desired_replicas == 1


def test_a_noisy_low_load_makes_one_change_and_no_reversal_over_an_hour():
    """An hour of in-flight counts swinging 2..8 around 5 from one replica: the spare is added
    once and kept (no reversal), the fleet never grows further."""
    s = spec()
    history, current, samples, moves = History(), 1, [], []
    for i in range(240):
        now = NOW + 15.0 * i
        running = 5.0 + 3.0 * math.sin(i * 1.7)
        samples = [x for x in samples if now - x.time <= 60] + [
            FleetSample(time=now, wait_quantile=0.002, observed_requests=100.0, ready_replicas=current,
                        requests_running=running, requests_waiting=0.0, slots_per_replica=SLOTS)]
        decision = decide(s, current, samples, history, now, quick_rebound=False)
        history = decision.history
        if decision.desired_replicas != current:
            moves.append(decision.desired_replicas - current)
        current = decision.desired_replicas
    assert moves == [1] and current == 2


def test_a_drop_of_one_replica_is_never_a_deep_drop():
    """2 -> 1 asks for half the replicas, but one replica is what noise moves at a low load:
    the 360 s window holds it (the deep-drop window let the spare go and come back minutes
    later on the reference engine's crowd). 3 -> 1 is still a deep drop."""
    history = History(recommendations=tuple((NOW - 300 + 15 * i, 2) for i in range(17)))
    calm = window(1.0, 2)
    held = decide(spec(), 2, calm, history, NOW, quick_rebound=False)
    assert held.raw_recommendation == 1
    assert held.desired_replicas == 2 and held.limited_by == "Stabilized"
    assert "deep drop" not in held.message
    history = History(recommendations=tuple((NOW - 300 + 15 * i, 3) for i in range(17))
                      + tuple((NOW - 45 + 15 * i, 1) for i in range(3)))
    history = History(recommendations=tuple((t, r) for t, r in history.recommendations if t < NOW - 60 or r == 1))
    deep = decide(spec(), 3, window(1.0, 3), history, NOW, quick_rebound=False)
    assert deep.desired_replicas == 1 and "deep drop" in deep.message
