"""Batch-token tuning: raise under sustained saturation at max replicas, lower after a quiet
period, never oscillate; and the effective spec the builders see."""
from __future__ import annotations

import pytest

from chattts_operator.api.autoscaling import BatchTokenTuning, BatchTokenTuningStatus, format_time
from chattts_operator.api.chattts import ChatTTSDeploymentSpec
from chattts_operator.autoscaling.tuning import tune_batch_tokens
from chattts_operator.deployment.spec import effective_spec

T0 = 1_800_000_000.0
TARGET = 0.005
TUNING = BatchTokenTuning(enabled=True, step=1024, cap=12288, sustained_for="3m", quiet_period="15m")


def run(waits, *, at_max=True, fits=lambda tokens: True, tuning=TUNING, base=8192, period=15.0, start=None):
    """Feed one wait per period; return the value after each step and the decisions."""
    state, values, decisions = start, [], []
    for i, wait in enumerate(waits):
        d = tune_batch_tokens(tuning, state, base_value=base, wait=wait, target=TARGET,
                              at_max_replicas=at_max, fits=fits, now=T0 + period * i)
        state = d.state
        values.append(d.value)
        decisions.append(d)
    return values, decisions


def test_raises_after_sustained_saturation_then_steps_up_to_the_cap():
    values, decisions = run([0.05] * 200)  # 50 minutes saturated
    raises = [d for d in decisions if d.reason == "Raised"]
    assert values[10] is None  # 150 s: not yet sustained for 3 minutes
    assert values[12] == 9216  # 180 s
    assert [d.value for d in raises] == [9216, 10240, 11264, 12288]  # one step per 3 minutes, cap respected
    assert values[-1] == 12288
    assert "at the cap" in decisions[-1].message


def test_no_raise_while_replicas_can_still_grow():
    values, _ = run([0.05] * 100, at_max=False)
    assert set(values) == {None}


def test_no_raise_when_the_memory_plan_would_not_fit():
    values, decisions = run([0.05] * 60, fits=lambda tokens: tokens <= 9216)
    assert values[-1] == 9216
    assert "would not fit" in decisions[-1].message


def test_lowers_after_a_quiet_period_back_to_the_spec_value():
    start = BatchTokenTuningStatus(max_num_batched_tokens=10240, last_change_time=format_time(T0 - 3600))
    values, decisions = run([0.001] * 200, start=start)  # 50 quiet minutes
    lowered = [(i, d.value) for i, d in enumerate(decisions) if d.reason == "Lowered"]
    assert lowered == [(60, 9216), (120, None)]  # each after a full 15 minutes; None = the spec's 8192


@pytest.mark.parametrize("wait", [0.003, 0.0049])  # between half the target and the target: the dead band
def test_dead_band_changes_nothing(wait):
    start = BatchTokenTuningStatus(max_num_batched_tokens=9216, last_change_time=format_time(T0 - 3600))
    values, _ = run([wait] * 200, start=start)
    assert set(values) == {9216}


def test_alternating_load_never_oscillates():
    # Ten minutes saturated, ten minutes quiet, for ten hours: at most one raise per saturated
    # stretch, and no lowering (a quiet stretch never lasts the 15-minute quiet period).
    waits = ([0.05] * 40 + [0.001] * 40) * 30
    values, decisions = run(waits)
    reasons = [d.reason for d in decisions if d.reason]
    assert "Lowered" not in reasons
    assert values[-1] == 12288


def test_missing_metric_holds_state():
    start = BatchTokenTuningStatus(max_num_batched_tokens=9216, last_change_time=format_time(T0 - 3600),
                                   quiet_since=format_time(T0 - 3000))
    values, decisions = run([None] * 10, start=start)
    assert set(values) == {9216} and all(d.state == start for d in decisions)


def test_disabling_reverts_to_the_spec():
    start = BatchTokenTuningStatus(max_num_batched_tokens=9216, last_change_time=format_time(T0 - 60))
    values, decisions = run([0.05], start=start, tuning=BatchTokenTuning(enabled=False))
    assert values == [None] and decisions[0].reason == "Reverted"


def _spec(tuning: dict, engine: dict | None = None) -> ChatTTSDeploymentSpec:
    return ChatTTSDeploymentSpec.model_validate({
        "model": {"hostPath": {"path": "/m"}}, "gpu": {"memory": "8Gi"}, "engine": {"kind": "vllm", **(engine or {})},
        "autoscaling": {"enabled": True, "maxReplicas": 3, "batchTokenTuning": tuning}})


def _body(tuned):
    return {"status": {"autoscaling": {"batchTokenTuning": {"maxNumBatchedTokens": tuned}}}}


@pytest.mark.parametrize(
    "tuning,engine,tuned,expected",
    [
        ({"enabled": True, "cap": 16384}, None, 9216, 9216),
        ({"enabled": False}, None, 9216, None),  # disabled: the spec's own value
        ({"enabled": True, "cap": 16384}, {"maxNumBatchedTokens": 12000}, 9216, 12000),  # spec above tuned wins
        ({"enabled": True, "cap": 8192}, None, 9216, 8192),  # cap lowered since: respected at once
        ({"enabled": True, "cap": 16384}, None, None, None),
    ],
)
def test_effective_spec(tuning, engine, tuned, expected):
    spec = _spec(tuning, engine)
    assert effective_spec(_body(tuned), spec).engine.max_num_batched_tokens == expected
