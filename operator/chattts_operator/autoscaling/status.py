"""Pure bookkeeping between a decision and ``status.autoscaling``: history in and out,
decision records, conditions, and whether a status write is worth making."""
from __future__ import annotations

from dataclasses import replace

from chattts_operator.api.common import Condition
from chattts_operator.api.autoscaling import (
    MAX_DECISIONS_KEPT,
    AutoscalingStatus,
    RecommendationRecord,
    ScaleEventRecord,
    ScalingDecisionRecord,
    format_duration,
    format_time,
    parse_duration,
    parse_time,
)
from chattts_operator.autoscaling.decision import Decision, History
from chattts_operator.core.conditions import condition, merge_conditions


def history_from_status(status: AutoscalingStatus | None) -> History:
    """The decision history persisted in status (so a restarted operator keeps its windows)."""
    if status is None:
        return History()
    return History(
        recommendations=tuple((parse_time(r.time), r.replicas) for r in status.recommendations),
        scale_events=tuple((parse_time(e.time), e.change) for e in status.scale_events),
        last_scale_up=parse_time(status.last_scale_up_time) if status.last_scale_up_time else None,
        step_seconds=parse_duration(status.step_time) if status.step_time else None,
    )


def _condition(previous: list[Condition], ctype: str, ok: bool, reason: str, message: str, now: str,
               generation: int | None) -> Condition:
    before = [c.model_dump(by_alias=True) for c in previous]
    [merged] = merge_conditions(before, [condition(ctype, ok, reason, message, generation=generation)], now)
    return Condition.model_validate(merged)


def next_status(
    previous: AutoscalingStatus | None,
    decision: Decision,
    current_replicas: int,
    now: float,
    *,
    scale_error: str | None = None,
    generation: int | None = None,
) -> AutoscalingStatus:
    """status.autoscaling after ``decision`` (and the scale write's outcome, if it failed); its conditions
    carry ``generation``, the object's metadata.generation the decision read."""
    previous = previous or AutoscalingStatus()
    stamp = format_time(now)
    applied = scale_error is None
    scaled = applied and decision.desired_replicas != current_replicas
    history = decision.history
    if not applied and history.scale_events and history.scale_events[-1][0] == now:
        # The change did not happen.
        before = history_from_status(previous)
        history = replace(history, scale_events=history.scale_events[:-1], last_scale_up=before.last_scale_up)

    record = ScalingDecisionRecord(
        time=stamp,
        metric_value=format_duration(decision.metric_value) if decision.metric_value is not None else None,
        current_replicas=current_replicas,
        desired_replicas=decision.desired_replicas,
        reason=decision.reason if applied else "ScaleFailed",
        message=decision.message if applied else f"{decision.message}; scale failed: {scale_error}",
    )
    decisions = list(previous.decisions)
    last = decisions[-1] if decisions else None
    # A hold that repeats the previous record adds nothing to the story.
    if scaled or last is None or (last.reason, last.desired_replicas) != (record.reason, record.desired_replicas):
        decisions.append(record)
    decisions = decisions[-MAX_DECISIONS_KEPT:]

    conditions = [
        _condition(previous.conditions, "ScalingActive", decision.metric_ok,
                   "ValidMetric" if decision.metric_ok else (decision.metric_problem
                                                             or decision.reason.removeprefix("Hold")),
                   decision.message if not decision.metric_ok else "the metric is fresh and valid", stamp, generation),
        _condition(previous.conditions, "AbleToScale", applied,
                   "SucceededRescale" if applied else "FailedUpdateScale",
                   scale_error or "the scale subresource accepts changes", stamp, generation),
        _condition(previous.conditions, "ScalingLimited", bool(decision.limited_by),
                   decision.limited_by or "DesiredWithinRange",
                   f"limited by {decision.limited_by}" if decision.limited_by else "the desired count is within range",
                   stamp, generation),
    ]
    return AutoscalingStatus(
        current_metric=format_duration(decision.metric_value) if decision.metric_value is not None else previous.current_metric,
        desired_replicas=decision.desired_replicas,
        last_scale_time=stamp if scaled else previous.last_scale_time,
        last_scale_up_time=format_time(history.last_scale_up) if history.last_scale_up is not None else None,
        forecast_floor=decision.forecast_floor,
        step_time=format_duration(history.step_seconds) if history.step_seconds is not None else None,
        last_evaluation_time=stamp,
        decisions=decisions,
        recommendations=[RecommendationRecord(time=format_time(t), replicas=r) for t, r in history.recommendations],
        scale_events=[ScaleEventRecord(time=format_time(t), change=c) for t, c in history.scale_events],
        conditions=conditions,
        batch_token_tuning=previous.batch_token_tuning,
    )


def worth_writing(previous: AutoscalingStatus | None, new: AutoscalingStatus) -> bool:
    """Write status only when something a reader cares about changed: not for every
    evaluation that holds (that would be a write every sync period per object)."""
    if previous is None:
        return True

    def essence(s: AutoscalingStatus):
        return (
            s.desired_replicas,
            s.last_scale_time,
            s.forecast_floor,
            [d.model_dump() for d in s.decisions],
            [(c.type, c.status, c.reason) for c in s.conditions],
            s.batch_token_tuning.model_dump() if s.batch_token_tuning else None,
        )

    return essence(previous) != essence(new)


def status_patch(status: AutoscalingStatus) -> dict:
    """``status.autoscaling`` as a JSON merge patch: fields that became empty are sent as
    null so the API server removes them (an absent key would keep its old value); list
    items carry no nulls (lists are replaced whole)."""
    patch = status.model_dump(by_alias=True, exclude_none=True)
    for name, info in AutoscalingStatus.model_fields.items():
        if getattr(status, name) is None:
            patch[info.alias or name] = None
    if status.batch_token_tuning is not None:
        tuning = patch["batchTokenTuning"]
        for name, info in type(status.batch_token_tuning).model_fields.items():
            if getattr(status.batch_token_tuning, name) is None:
                tuning[info.alias or name] = None
    return patch
