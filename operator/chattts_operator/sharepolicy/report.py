"""A plan -> the writes to make (in order), the policy's status and its Events. Pure."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping, Sequence

from chattts_operator.api.sharepolicy import MAX_ACTIONS_KEPT, MAX_MEMBERS_LISTED
from chattts_operator.core.clock import rfc3339
from chattts_operator.core.conditions import condition, merge_conditions
from chattts_operator.sharepolicy.planner import OFFLINE_KIND, ONLINE_KIND, Action, OfflineMember, OnlineMember, Plan

_EVENT_REASONS = {"Suspend": "Suspended", "Resume": "Resumed", "ScaleDown": "ScaledDown", "ScaleUp": "ScaledUp"}


@dataclass(frozen=True)
class Write:
    """One write to a member: a Job's spec.suspend, or a ChatTTSDeployment's replica cap."""

    kind: str  # Job | ChatTTSDeployment
    namespace: str
    name: str
    suspend: bool | None = None  # Jobs
    cap: int | None = None  # ChatTTSDeployments
    reason: str = ""
    action: Action | None = None  # None: only the recorded cap changes, no replica moves


def format_time(instant: datetime | None) -> str | None:
    return None if instant is None else rfc3339(instant)


def writes_for(plan: Plan, online: Sequence[OnlineMember], offline: Sequence[OfflineMember]) -> list[Write]:
    """Every write the plan needs, in a safe order: releases (and cap records that move no
    replica) first, then growth, in the plan's own action order."""
    by_action = {(a.kind, a.namespace, a.name): a for a in plan.actions}
    quiet: list[Write] = []
    for m in sorted(online, key=lambda m: m.key):
        cap = plan.caps[m.key]
        if cap != m.current_cap and (ONLINE_KIND, m.namespace, m.name) not in by_action:
            quiet.append(Write(ONLINE_KIND, m.namespace, m.name, cap=cap, reason=plan.reasons.get(m.key, "")))
    ordered: list[Write] = []
    for action in plan.actions:
        if action.kind == OFFLINE_KIND:
            write = Write(OFFLINE_KIND, action.namespace, action.name, suspend=action.action == "Suspend",
                          reason=action.reason, action=action)
        else:
            write = Write(ONLINE_KIND, action.namespace, action.name, cap=action.replicas, reason=action.reason,
                          action=action)
        ordered.append(write)
    releases = [w for w in ordered if w.action and w.action.action in ("Suspend", "ScaleDown")]
    growth = [w for w in ordered if w.action and w.action.action in ("ScaleUp", "Resume")]
    return releases + quiet + growth


def policy_status(
    plan: Plan,
    online: Sequence[OnlineMember],
    offline: Sequence[OfflineMember],
    previous: Mapping[str, Any] | None,
    now: datetime,
    generation: int | None,
    done: Sequence[Write],
    overlaps: Sequence[tuple[str, str]] = (),
    problems: Sequence[str] = (),
    notes: Sequence[str] = (),
    outside: Sequence[str] = (),
) -> dict[str, Any]:
    """status of the GPUSharePolicy after the writes in ``done`` succeeded. ``problems`` make
    Valid False; ``notes`` are said with Valid True (e.g. a policy over the same nodes that
    yields to this one); ``outside``: members' pods on nodes outside the pool (not counted)."""
    previous = dict(previous or {})
    stamp = format_time(now) or ""
    members: list[dict[str, Any]] = []
    for m in sorted(online, key=lambda m: m.key):
        members.append({
            "kind": ONLINE_KIND, "namespace": m.namespace, "name": m.name, "gpuMemoryMiB": m.per_replica_mib,
            "replicaCap": plan.caps[m.key], "state": "", "reason": plan.reasons.get(m.key, ""),
        })
    for j in sorted(offline, key=lambda j: j.key):
        members.append({
            "kind": OFFLINE_KIND, "namespace": j.namespace, "name": j.name, "gpuMemoryMiB": j.demand_mib,
            "state": plan.job_state.get(j.key, ""), "reason": plan.reasons.get(j.key, ""),
        })
    records = list(previous.get("lastActions") or [])
    for write in done:
        if write.action is not None:
            records.append({
                "time": stamp, "action": write.action.action, "kind": write.kind,
                "namespace": write.namespace, "name": write.name, "reason": write.reason,
            })
    conditions = merge_conditions(previous.get("conditions"), [
        condition("Valid", not problems, "Problems" if problems else "Valid", "; ".join(problems or notes),
                  generation=generation),
        condition("Balanced", plan.settled, "Balanced" if plan.settled else "WaitingForRelease",
                  "members hold their shares" if plan.settled else "; ".join(plan.deferred), generation=generation),
        condition("PodsOutsidePool", bool(outside), "PodsOutsidePool" if outside else "AllInPool",
                  (f"{len(outside)} member pods run on nodes outside the pool and are not counted against its "
                   f"shares: {', '.join(outside[:10])}" if outside else "every member pod is in the pool"),
                  generation=generation),
    ], stamp)
    return {
        "observedGeneration": generation,
        "window": plan.window,
        "nextChange": format_time(plan.next_change),
        "shares": {"online": plan.shares.online, "offline": plan.shares.offline},
        "pool": {"nodes": plan.pool_nodes, "gpuMemoryMiB": plan.pool_mib},
        "budget": {"onlineMiB": plan.online_budget_mib, "offlineMiB": plan.offline_budget_mib},
        "used": {"onlineMiB": plan.asked_online_mib, "offlineMiB": plan.asked_offline_mib, "totalMiB": plan.asked_after_mib},
        "members": members[:MAX_MEMBERS_LISTED],
        "memberCount": len(members),
        "lastActions": records[-MAX_ACTIONS_KEPT:],
        "overlaps": [f"{a}/{b}" for a, b in overlaps],
        "conditions": conditions,
    }


def policy_events(plan: Plan, previous: Mapping[str, Any] | None, done: Sequence[Write]) -> list[tuple[str, str, str]]:
    """(type, reason, message) Events for the policy itself: window changes and every action."""
    previous = previous or {}
    events: list[tuple[str, str, str]] = []
    if "window" not in previous or previous.get("window") != plan.window or previous.get("shares") != {
        "online": plan.shares.online, "offline": plan.shares.offline
    }:
        label = f"window {plan.window!r}" if plan.window else "default shares (no window)"
        until = f" until {format_time(plan.next_change)}" if plan.next_change else ""
        events.append(("Normal", "WindowChanged",
                       f"{label} in force: online {plan.shares.online}%, offline {plan.shares.offline}% of "
                       f"{plan.pool_mib} MiB{until}"))
    for write in done:
        if write.action is not None:
            events.append(("Normal", _EVENT_REASONS[write.action.action],
                           f"{write.kind} {write.namespace}/{write.name}: {write.reason}"))
    return events


def member_event(write: Write) -> tuple[str, str, str]:
    """The Event posted on the member itself."""
    if write.kind == OFFLINE_KIND:
        verb = "suspended" if write.suspend else "resumed"
        return ("Normal", "Suspended" if write.suspend else "Resumed", f"{verb} by its GPUSharePolicy: {write.reason}")
    return ("Normal", "ReplicaCapChanged", f"replica cap {write.cap} from its GPUSharePolicy: {write.reason}")
