"""Opt-in batch-token tuning: a pure function of (settings, state, wait, room, now).

When replicas can grow no further (maxReplicas or the GPU share cap) and the wait has
stayed above target for ``sustainedFor``, raise the engine's ``maxNumBatchedTokens`` by
``step`` (more prefill per step admits queued requests sooner), if the GPU memory plan
still fits with the larger activation buffer and keeps room for ``maxNumSeqs``
sequences of KV cache, and never above ``cap``. After the wait has stayed below half
the target for ``quietPeriod``, step back down, never below the spec's own value.

No oscillation, by construction: raising and lowering need opposite conditions with a
dead band between them (above target vs below half of it), each needs its condition
to hold for its whole period, and each change restarts both clocks. Every change is a
rolling update, so it is rare: at most one step per ``sustainedFor``.

The tuned value lives in ``status.autoscaling.batchTokenTuning.maxNumBatchedTokens``;
``deployment.spec.effective_spec`` applies it over ``spec.engine`` for the builders and the planner.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from chattts_operator.api.autoscaling import (
    BatchTokenTuning,
    BatchTokenTuningStatus,
    format_time,
    parse_duration,
    parse_time,
)


@dataclass(frozen=True)
class TuningDecision:
    state: BatchTokenTuningStatus
    value: int | None  # the tuned maxNumBatchedTokens; None: the spec's own value applies
    changed: bool
    reason: str  # Raised, Lowered, Reverted, or "" when nothing changed
    message: str


def tune_batch_tokens(
    tuning: BatchTokenTuning,
    previous: BatchTokenTuningStatus | None,
    *,
    base_value: int,
    wait: float | None,
    target: float,
    at_max_replicas: bool,
    fits: Callable[[int], bool],
    now: float,
) -> TuningDecision:
    """The next tuning state. ``base_value`` is the engine's value without tuning;
    ``fits(tokens)`` says whether the memory plan holds with that many batched tokens;
    ``wait`` None means the metric is missing: the state holds."""
    previous = previous or BatchTokenTuningStatus()
    tuned = previous.max_num_batched_tokens
    if not tuning.enabled:
        if tuned is None:
            return TuningDecision(previous, None, False, "", "tuning disabled")
        return TuningDecision(BatchTokenTuningStatus(last_change_time=format_time(now)), None, True, "Reverted",
                              f"tuning disabled: back to {base_value} batched tokens")
    if tuned is not None and tuned <= base_value:
        tuned = None  # the spec was raised past the tuned value: it wins
    current = tuned if tuned is not None else base_value
    if wait is None:
        return TuningDecision(previous, tuned, False, "", "metric missing: holding")

    above = wait > target and at_max_replicas
    quiet = wait < target / 2.0
    above_since = (previous.above_target_since or format_time(now)) if above else None
    quiet_since = (previous.quiet_since or format_time(now)) if quiet else None
    since_change = now - parse_time(previous.last_change_time) if previous.last_change_time else float("inf")
    sustained = parse_duration(tuning.sustained_for)
    quiet_period = parse_duration(tuning.quiet_period)

    def state(value: int | None, changed_now: bool) -> BatchTokenTuningStatus:
        stamp = format_time(now)
        return BatchTokenTuningStatus(
            max_num_batched_tokens=value,
            last_change_time=stamp if changed_now else previous.last_change_time,
            # A change restarts both clocks: the next step needs a whole new period.
            above_target_since=(stamp if above else None) if changed_now else above_since,
            quiet_since=(stamp if quiet else None) if changed_now else quiet_since,
        )

    if above and now - parse_time(above_since) >= sustained and since_change >= sustained:
        proposed = current + tuning.step
        if tuning.cap is not None and proposed > tuning.cap:
            return TuningDecision(state(tuned, False), tuned, False, "", f"at the cap ({tuning.cap})")
        if not fits(proposed):
            return TuningDecision(state(tuned, False), tuned, False, "",
                                  f"{proposed} batched tokens would not fit the GPU memory plan")
        return TuningDecision(state(proposed, True), proposed, True, "Raised",
                              f"wait above target for {tuning.sustained_for} at max replicas: "
                              f"maxNumBatchedTokens {current} -> {proposed}")
    if quiet and tuned is not None and now - parse_time(quiet_since) >= quiet_period and since_change >= quiet_period:
        lowered = current - tuning.step
        value = lowered if lowered > base_value else None
        return TuningDecision(state(value, True), value, True, "Lowered",
                              f"wait below half the target for {tuning.quiet_period}: "
                              f"maxNumBatchedTokens {current} -> {value or base_value}")
    return TuningDecision(state(tuned, False), tuned, False, "", "no change")
