"""The operator's own timing metrics: how late its event loop runs ready work, and a spec
change's span cut into stages (core/metrics.py, deployment/controller.py)."""
from __future__ import annotations

import asyncio
import time

from chattts_operator.core import metrics
from chattts_operator.deployment.controller import _observe_spec_change, _Slot


def sample(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_loop_lag_is_what_a_blocked_loop_makes_a_timer_wait():
    async def scenario() -> None:
        watcher = asyncio.create_task(metrics.watch_loop_lag(period=0.01))
        await asyncio.sleep(0.05)  # a few idle periods: no lag worth a bucket
        time.sleep(0.3)  # a callback that hogs the loop (what a CPU-heavy handler does)
        await asyncio.sleep(0.05)
        watcher.cancel()

    count, total = sample("chattts_operator_event_loop_lag_seconds_count"), sample("chattts_operator_event_loop_lag_seconds_sum")
    late = sample("chattts_operator_event_loop_lag_seconds_count") - sample(
        "chattts_operator_event_loop_lag_seconds_bucket", le="0.25")
    asyncio.run(scenario())
    assert sample("chattts_operator_event_loop_lag_seconds_count") - count >= 3
    assert sample("chattts_operator_event_loop_lag_seconds_sum") - total >= 0.25
    assert sample("chattts_operator_event_loop_lag_seconds_count") - sample(
        "chattts_operator_event_loop_lag_seconds_bucket", le="0.25") - late == 1  # the one blocked period


def test_a_spec_changes_span_is_recorded_by_stage_once():
    before = {stage: sample("chattts_operator_spec_change_stage_seconds_sum", stage=stage)
              for stage in ("queued", "built", "applied")}
    total = sample("chattts_operator_spec_change_seconds_sum")
    slot = _Slot(change_seen_at=100.0, change_started_at=100.2, change_built_at=100.25)
    _observe_spec_change(slot, 100.75)
    got = {stage: sample("chattts_operator_spec_change_stage_seconds_sum", stage=stage) - before[stage]
           for stage in before}
    assert abs(got["queued"] - 0.2) < 1e-9 and abs(got["built"] - 0.05) < 1e-9 and abs(got["applied"] - 0.5) < 1e-9
    assert abs(sample("chattts_operator_spec_change_seconds_sum") - total - 0.75) < 1e-9
    assert slot.change_seen_at is None and slot.change_started_at is None and slot.change_built_at is None
    # A change applied by a reconcile that was already running (it never started one of its own).
    _observe_spec_change(_Slot(change_seen_at=200.0), 200.4)
    assert abs(sample("chattts_operator_spec_change_stage_seconds_sum", stage="applied") - before["applied"] - 0.9) < 1e-9
