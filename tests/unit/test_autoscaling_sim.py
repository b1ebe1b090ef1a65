"""The autoscaler benchmark's simulator and baselines: exact on cases worked by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from bench.autoscaler.fleet import FleetModel, flaps, minute_quantiles, reversals, simulate
from bench.autoscaler.policies import Hpa, Keda, ReactiveOracle
from chattts_operator.autoscaling import FleetSample


class Fixed:
    name = "fixed"

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.seen: list[FleetSample] = []

    def evaluate(self, now, current, sample):
        self.seen.append(sample)
        return self.replicas


ONE_SLOT = FleetModel(slots=1, step_table=((1, 0.01),), pipeline_factor=1.0, cold_start_seconds=30.0,
                      sync_seconds=15.0, window_seconds=60.0)


def test_queueing_on_one_slot_is_exact():
    arrivals = np.array([0.0, 0.5, 0.6])
    frames = np.array([100.0, 100.0, 100.0])  # 1 s each
    result = simulate(ONE_SLOT, arrivals, frames, Fixed(1), 1, 10.0, seed=0)
    w = result.waits
    assert 0 <= w[0] <= 0.01
    # The second starts when the first ends (at w[0] + 1 s), plus its own step phase.
    assert w[1] == pytest.approx(w[0] + 1.0 - 0.5, abs=0.0101)
    assert w[2] == pytest.approx(w[1] + 0.5 + 1.0 - 0.6, abs=0.0101)  # arrived at 0.6


def test_a_request_slows_down_while_another_shares_its_replica():
    model = FleetModel(slots=2, step_table=((1, 0.01), (2, 0.02)), pipeline_factor=1.0, cold_start_seconds=30.0)
    arrivals = np.array([0.0, 0.5, 0.6])
    frames = np.array([100.0, 100.0, 10.0])
    result = simulate(model, arrivals, frames, Fixed(1), 1, 10.0, seed=0)
    # A runs alone at 10 ms a frame for 0.5 s (50 frames), then shares: 20 ms a frame for its
    # last 50 frames, ending at 1.5 s. C, queued at 0.6 s behind the two, starts then.
    assert result.waits[2] == pytest.approx(1.5 - 0.6, abs=0.03)


def test_random_routing_and_new_replicas_after_cold_start():
    arrivals = np.arange(0.0, 120.0, 0.08)
    frames = np.full(len(arrivals), 10.0)  # 0.1 s each: 1.25 requests in flight on average
    scaler = Fixed(3)
    result = simulate(ONE_SLOT, arrivals, frames, scaler, 1, 120.0, seed=1)
    assert result.changes == [(15.0, 2)]
    ready = {t: r for t, _, r, _ in result.timeline}
    assert ready[30.0] == 1 and ready[45.0] == 3  # ready 30 s after the change at 15 s
    # Overloaded alone (1.25 in flight, 1 slot); once three replicas share the load and the
    # first one's backlog has drained, most requests start at once.
    early = result.waits[(arrivals > 10) & (arrivals < 15)]
    late = result.waits[arrivals > 90]
    assert np.median(early) > 0.2 and np.median(late) < 0.02
    assert result.replica_seconds == pytest.approx(15 * 1 + 105 * 3)


def test_samples_report_the_window_quantile_and_gauges():
    arrivals = np.array([1.0, 1.1])
    frames = np.array([2000.0, 100.0])  # the first holds the only slot for 20 s
    scaler = Fixed(1)
    simulate(ONE_SLOT, arrivals, frames, scaler, 1, 16.0, seed=2)
    sample = scaler.seen[0]  # at 15 s
    assert sample.requests_running == 1 and sample.requests_waiting == 1
    assert sample.observed_requests == 1 and sample.wait_quantile <= 0.01


def test_minute_quantiles_and_reversals():
    arrivals = np.array([10.0, 20.0, 70.0])
    waits = np.array([0.001, 0.010, 0.002])
    q = minute_quantiles(arrivals, waits, 180.0, 0.99)
    assert q[0] == pytest.approx(0.00991) and q[1] == 0.002 and math.isnan(q[2])
    changes = [(0, 1), (100, 1), (200, -1), (1000, 1), (1100, -2)]
    assert reversals(changes) == 3
    assert flaps(changes, within=600) == 2  # 100 -> 200 and 1000 -> 1100


def _sample(wait=0.0, waiting=0.0):
    return FleetSample(time=0.0, wait_quantile=wait, requests_waiting=waiting, requests_running=0.0)


def test_hpa_baseline_ratio_tolerance_and_stabilization():
    hpa = Hpa(0.005, 1, 16)
    assert hpa.evaluate(0.0, 2, _sample(wait=0.0052)) == 2  # within 10%
    assert hpa.evaluate(15.0, 2, _sample(wait=0.010)) == 4  # ceil(2 * 2)
    assert hpa.evaluate(30.0, 4, _sample(wait=0.100)) == 8  # ceil(4 * 20) = 80, limited to +100% per 15 s
    assert hpa.evaluate(45.0, 8, _sample(wait=0.0)) == 8  # down: the highest of the last 300 s
    assert hpa.evaluate(346.0, 8, _sample(wait=0.0)) == 1  # the 80 has left the window


def test_keda_baseline_average_value_on_waiting():
    keda = Keda(5.0, 1, 16)
    assert keda.evaluate(0.0, 1, _sample(waiting=12)) == 3  # ceil(12 / 5)
    assert keda.evaluate(15.0, 3, _sample(waiting=15)) == 3  # usage ratio 1: no change
    assert keda.evaluate(30.0, 3, _sample(waiting=0)) == 3  # stabilized
    assert keda.evaluate(331.0, 3, _sample(waiting=0)) == 1


def test_the_reactive_oracle_goes_to_max_the_moment_the_rate_outgrows_its_replicas():
    """It reads the true rate of the present (no metric: the sample may be missing), jumps to
    max at once and never scales down: its violations are the cold start's alone."""
    rate = np.array([2.0] * 10 + [9.0] * 10 + [1.0] * 10)
    oracle = ReactiveOracle(rate, per_replica_rate=4.0, max_replicas=16)
    assert oracle.evaluate(5.0, 1, None) == 1  # 2 req/s: one replica carries 4
    assert oracle.evaluate(12.0, 2, None) == 16  # 9 req/s > 2 x 4: max at once, not 3
    assert oracle.evaluate(25.0, 16, None) == 16  # the load fell: it never scales down
    assert oracle.evaluate(99.0, 1, None) == 1  # past the trace: its last rate

