"""Fifth-round rules of the autoscaler (pure): while replicas start, size for the arrivals
(Little's law), not the backlog stuck on the Ready replicas; the growth room is one spare
replica at most; a scale-down keeps 3.5 sigma of Poisson noise."""
from __future__ import annotations

import math
from functools import partial

import pytest

from chattts_operator.autoscaling import FleetSample, History, decide
from chattts_operator.autoscaling.decision import (
    SHRINK_SIGMAS,
    arrivals_in_flight,
    growth_headroom,
    shrink_headroom,
)
from tests.unit.autoscaling_support import LIMIT, NOW, SLOTS, autoscaling_spec

WINDOW = 60.0

spec = partial(autoscaling_spec, 16)


def backlog(ready: int, waiting: list[float], *, starts: float, wait: float = 2.0) -> list[FleetSample]:
    """The Ready replicas full (16 running each), the queue on them as given, one sample per 15 s."""
    n = len(waiting)
    return [FleetSample(time=NOW - 15.0 * (n - 1 - i), wait_quantile=wait, observed_requests=starts,
                        ready_replicas=ready, requests_running=SLOTS * ready, requests_waiting=w,
                        slots_per_replica=SLOTS) for i, w in enumerate(waiting)]


def test_arrivals_in_flight_is_littles_law_on_starts_plus_queue_growth():
    # 32 running; 60 starts in the 60 s window (1/s); the queue grew by 45 in 45 s (1/s more):
    # the arrivals come at 2/s, twice what starts, so they would hold 64 in flight.
    samples = backlog(2, [0.0, 15.0, 30.0, 45.0], starts=60.0)
    assert arrivals_in_flight(samples, WINDOW) == pytest.approx(64.0)
    # A queue that shrinks adds nothing: the arrivals are at most what starts.
    draining = backlog(2, [45.0, 30.0, 15.0, 0.0], starts=60.0)
    assert arrivals_in_flight(draining, WINDOW) == pytest.approx(32.0)
    # No start in the window, unknown gauges, no sample: unknown.
    assert arrivals_in_flight(backlog(2, [0.0, 10.0], starts=0.0), WINDOW) is None
    unknown = [FleetSample(**{**s.__dict__, "requests_waiting": None}) for s in samples]
    assert arrivals_in_flight(unknown, WINDOW) is None
    assert arrivals_in_flight([], WINDOW) is None


def test_while_replicas_start_a_growing_backlog_does_not_ask_for_max_replicas():
    """A crowd: 2 Ready replicas full, 9 asked, the queue on the Ready ones growing by 1.5 a
    second (it will never move to the new replicas). The in-flight count (32 + 157.5 waiting) asks
    for maxReplicas; the arrivals (32 x (1 + 1.5) / 1 = 80 in flight) ask for 12 (room included)."""
    samples = backlog(2, [90.0, 112.5, 135.0, 157.5], starts=60.0)
    arrivals = arrivals_in_flight(samples, WINDOW)
    assert arrivals == pytest.approx(80.0)
    assert math.ceil((32.0 + 157.5) / LIMIT) > 16
    decision = decide(spec(), 9, samples, History(), NOW)
    expected = math.ceil(growth_headroom(arrivals) / LIMIT)
    assert expected == 12
    assert decision.raw_recommendation == expected
    assert decision.desired_replicas == expected
    assert "sized for the arrivals" in decision.message
    # The same queue with every asked replica Ready is no cold start: the backlog rules apply.
    ready = [FleetSample(**{**s.__dict__, "ready_replicas": 9, "requests_running": SLOTS * 9}) for s in samples]
    assert "sized for the arrivals" not in decide(spec(), 9, ready, History(), NOW).message


def test_while_replicas_start_the_arrivals_never_scale_down():
    samples = backlog(2, [10.0, 10.0, 10.0, 10.0], starts=60.0)  # 32 in flight: 5 by the sizing
    decision = decide(spec(), 9, samples, History(), NOW)
    assert decision.desired_replicas == 9


def test_growth_room_is_one_spare_replica_at_most():
    """80 in flight need 10 replicas; 1.5 sigma of room (93.4) would ask 12: one spare, 11."""
    samples = [FleetSample(time=NOW - 15.0 * (3 - i), wait_quantile=0.002, observed_requests=100.0,
                           ready_replicas=10, requests_running=80.0, requests_waiting=0.0,
                           slots_per_replica=SLOTS) for i in range(4)]
    assert math.ceil(growth_headroom(80.0) / LIMIT) == 12
    decision = decide(spec(), 10, samples, History(), NOW)
    assert decision.desired_replicas == 11
    assert decision.sized == 10
    assert "room for 1.5 sigma of noise" in decision.message
    # At the spare already: no room-only growth.
    assert decide(spec(), 11, samples, History(), NOW).desired_replicas == 11


def test_shrink_keeps_three_and_a_half_sigma():
    """The bursts' base load on the anchor: ~17 in flight at the limit's step time on 5 replicas.
    3 sigma and the tolerance ((17 + 12.4) x 1.1 = 32.3) fit 4 replicas (32.7): the fleet went to 4
    and the next burst found it one short. 3.5 sigma (34.6) holds 5."""
    assert SHRINK_SIGMAS == 3.5
    assert shrink_headroom(16.0) == 16.0 + 3.5 * 4.0
    assert shrink_headroom(0.0) == 0.0
    assert (17.0 + 3.0 * math.sqrt(17.0)) * 1.1 < 4 * LIMIT < shrink_headroom(17.0) * 1.1
    samples = [FleetSample(time=NOW - 15.0 * (3 - i), wait_quantile=0.001, observed_requests=100.0,
                           ready_replicas=5, requests_running=17.0, requests_waiting=0.0,
                           slots_per_replica=SLOTS) for i in range(4)]
    held = decide(spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}), 5, samples, History(), NOW)
    assert held.desired_replicas == 5
