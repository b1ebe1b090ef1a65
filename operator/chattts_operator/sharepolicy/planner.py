"""The rebalancing planner: ``plan(policy, members, nodes, now) -> Plan``. Pure.

What a member *asks* of the pool (the quantity the invariant is about):
- an online member: ``max(pods that exist, replicas allowed) x MiB per replica``;
- an offline Job: ``max(pods that exist, parallelism) x MiB per pod`` while it runs, and
  ``pods that exist x MiB per pod`` once suspended or finished.
Pods count until they are gone (a terminating pod still holds its GPU memory), so a
release (suspend, scale-down) frees memory only when the next observation shows it.

The plan for one instant:
1. The window in force gives the shares; the pool (Ready, schedulable nodes) gives MiB;
   ``budget = floor(pool x share%)`` for each side.
2. Targets: online replicas are handed out one at a time, round-robin over members, while
   the online budget holds another replica and the member wants more (its ``spec.replicas``,
   or its autoscaler's ``maxReplicas``). Offline Jobs, in priority order (higher first; among
   equals running before suspended, then older), run if their whole ``parallelism`` fits in what is left of the offline budget;
   a Job that does not fit waits and smaller ones after it may still run.
3. Actions, in the order they must be applied: suspends, scale-downs, then scale-ups and
   resumes, each growth accepted only if the memory asked *after it*, with every pod that
   still exists counted, stays within the pool. Growth that does not fit yet is deferred,
   with the reason, to a later pass (the controller re-plans soon when anything is deferred).
So if the observed state is within the pool, applying the actions in order keeps it within
the pool at every step; if it is not (a node left), the plan only releases.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Literal, Sequence

from chattts_operator.api.sharepolicy import GPUSharePolicySpec, Shares
from chattts_operator.sharepolicy.windows import resolve

ONLINE_KIND = "ChatTTSDeployment"
OFFLINE_KIND = "Job"

ActionKind = Literal["Suspend", "ScaleDown", "ScaleUp", "Resume"]
_ACTION_ORDER = {"Suspend": 0, "ScaleDown": 1, "ScaleUp": 2, "Resume": 3}


@dataclass(frozen=True)
class PoolNode:
    name: str
    gpu_memory_mib: int
    usable: bool = True  # Ready and schedulable


@dataclass(frozen=True)
class OnlineMember:
    """A ChatTTSDeployment in the policy."""

    namespace: str
    name: str
    per_replica_mib: int
    wanted_replicas: int  # spec.replicas, or autoscaling.maxReplicas when autoscaling is on
    current_cap: int | None = None  # the cap it carries now (None: never capped)
    observed_pods: int = 0  # its serving pods that exist now, terminating ones included

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def allowed(self) -> int:
        """Replicas it may run under its current cap."""
        return self.wanted_replicas if self.current_cap is None else min(self.wanted_replicas, self.current_cap)

    def asked_mib(self, allowed: int) -> int:
        return max(self.observed_pods, allowed) * self.per_replica_mib


@dataclass(frozen=True)
class OfflineMember:
    """A batch/v1 Job in the policy."""

    namespace: str
    name: str
    per_pod_mib: int
    parallelism: int  # pods it runs at once while it runs
    suspended: bool
    priority: int = 0
    created: str = ""  # RFC 3339; older first among equal priorities
    finished: bool = False
    observed_pods: int = 0  # its pods that exist and have not finished, terminating ones included

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def demand_mib(self) -> int:
        return self.parallelism * self.per_pod_mib

    def asked_mib(self, suspended: bool) -> int:
        if suspended or self.finished:
            return self.observed_pods * self.per_pod_mib
        return max(self.observed_pods, self.parallelism) * self.per_pod_mib


@dataclass(frozen=True)
class Action:
    action: ActionKind
    kind: str
    namespace: str
    name: str
    reason: str
    replicas: int | None = None  # the new cap, for ScaleDown/ScaleUp


@dataclass(frozen=True)
class Plan:
    window: str
    shares: Shares
    next_change: datetime | None
    pool_nodes: int
    pool_mib: int
    online_budget_mib: int
    offline_budget_mib: int
    caps: dict[tuple[str, str], int]  # online member -> cap to write now
    targets: dict[tuple[str, str], int]  # online member -> the cap it will get once room frees
    job_running: dict[tuple[str, str], bool]  # offline member -> runs after this pass
    job_state: dict[tuple[str, str], str]  # Running | Suspended | Waiting | Finished
    reasons: dict[tuple[str, str], str]
    actions: list[Action]
    asked_before_mib: int
    asked_after_mib: int
    asked_online_mib: int
    asked_offline_mib: int
    deferred: list[str] = field(default_factory=list)

    @property
    def settled(self) -> bool:
        """True when nothing waits for memory to be freed (the controller may sleep longer)."""
        return not self.deferred


def budgets(pool_mib: int, shares: Shares) -> tuple[int, int]:
    return math.floor(pool_mib * shares.online / 100), math.floor(pool_mib * shares.offline / 100)


def online_targets(members: Sequence[OnlineMember], budget_mib: int) -> dict[tuple[str, str], int]:
    """Replicas per online member: one at a time, round-robin in (namespace, name) order,
    while the budget holds another replica and the member wants more."""
    ordered = sorted(members, key=lambda m: m.key)
    given = {m.key: 0 for m in ordered}
    left = budget_mib
    progress = True
    while progress:
        progress = False
        for m in ordered:
            if given[m.key] < m.wanted_replicas and m.per_replica_mib <= left:
                given[m.key] += 1
                left -= m.per_replica_mib
                progress = True
    return given


def offline_order(jobs: Iterable[OfflineMember]) -> list[OfflineMember]:
    """Higher priority first; among equals, running Jobs before suspended ones (no churn
    between peers: suspending one to resume its equal only loses work), then older first."""
    return sorted(jobs, key=lambda j: (-j.priority, j.suspended, j.created, j.namespace, j.name))


def offline_targets(jobs: Sequence[OfflineMember], budget_mib: int) -> dict[tuple[str, str], bool]:
    """Which unfinished Jobs run: priority order, each if its whole parallelism fits what is left."""
    left = budget_mib
    running: dict[tuple[str, str], bool] = {}
    for job in offline_order(j for j in jobs if not j.finished):
        fits = job.demand_mib <= left
        running[job.key] = fits
        if fits:
            left -= job.demand_mib
    return running


def plan(
    policy: GPUSharePolicySpec,
    online: Sequence[OnlineMember],
    offline: Sequence[OfflineMember],
    nodes: Sequence[PoolNode],
    now: datetime,
) -> Plan:
    resolution = resolve(policy, now)
    usable = [n for n in nodes if n.usable]
    pool_mib = sum(n.gpu_memory_mib for n in usable)
    online_budget, offline_budget = budgets(pool_mib, resolution.shares)
    window_label = f"window {resolution.window!r}" if resolution.window else "default shares (no window)"

    target_caps = online_targets(online, online_budget)
    target_running = offline_targets(offline, offline_budget)

    # The state as it will be after each action; asked memory is recomputed from it.
    allowed = {m.key: m.allowed for m in online}
    suspended = {j.key: j.suspended or j.finished for j in offline}
    by_key_online = {m.key: m for m in online}
    by_key_offline = {j.key: j for j in offline}

    def asked_online() -> int:
        return sum(by_key_online[k].asked_mib(v) for k, v in allowed.items())

    def asked_offline() -> int:
        return sum(by_key_offline[k].asked_mib(v) for k, v in suspended.items())

    asked_before = asked_online() + asked_offline()
    actions: list[Action] = []
    reasons: dict[tuple[str, str], str] = {}
    deferred: list[str] = []

    # 1. Releases: they never raise what is asked, so they are always safe.
    for job in offline_order(offline):
        if job.finished:
            reasons[job.key] = "finished"
            continue
        if not target_running[job.key] and not job.suspended:
            reason = (
                f"{window_label}: offline share {offline_budget} MiB has no room for its "
                f"{job.demand_mib} MiB after higher-priority jobs"
            )
            suspended[job.key] = True
            reasons[job.key] = reason
            actions.append(Action("Suspend", OFFLINE_KIND, job.namespace, job.name, reason))
    for m in sorted(online, key=lambda m: m.key):
        target = target_caps[m.key]
        if target < m.allowed or (m.current_cap is not None and target < m.current_cap):
            reason = (
                f"{window_label}: online share {online_budget} MiB allows {target} of {m.wanted_replicas} "
                f"replicas of {m.per_replica_mib} MiB"
            )
            if target < m.allowed:
                actions.append(Action("ScaleDown", ONLINE_KIND, m.namespace, m.name, reason, replicas=target))
            allowed[m.key] = target
            reasons[m.key] = reason

    # 2. Growth, each step only if the pool still holds everything asked after it.
    for m in sorted(online, key=lambda m: m.key):
        target = target_caps[m.key]
        if target <= allowed[m.key]:
            reasons.setdefault(
                m.key,
                f"{window_label}: online share {online_budget} MiB allows {target} of {m.wanted_replicas} replicas",
            )
            continue
        start = allowed[m.key]
        while allowed[m.key] < target:
            allowed[m.key] += 1
            if asked_online() + asked_offline() > pool_mib:
                allowed[m.key] -= 1
                break
        if allowed[m.key] > start:
            reason = (
                f"{window_label}: online share {online_budget} MiB allows {target} of {m.wanted_replicas} "
                f"replicas of {m.per_replica_mib} MiB"
            )
            actions.append(Action("ScaleUp", ONLINE_KIND, m.namespace, m.name, reason, replicas=allowed[m.key]))
            reasons[m.key] = reason
        if allowed[m.key] < target:
            wait = f"{m.namespace}/{m.name}: {target - allowed[m.key]} replica(s) wait for GPU memory still held by pods being released"
            deferred.append(wait)
            reasons[m.key] = wait

    for job in offline_order(offline):
        if job.finished or not target_running[job.key]:
            if not job.finished and job.key not in reasons:
                reasons[job.key] = (
                    f"{window_label}: offline share {offline_budget} MiB has no room for its {job.demand_mib} MiB"
                )
            continue
        if not suspended[job.key]:
            reasons.setdefault(job.key, f"{window_label}: fits the offline share {offline_budget} MiB")
            continue
        suspended[job.key] = False
        if asked_online() + asked_offline() > pool_mib:
            suspended[job.key] = True
            wait = f"{job.namespace}/{job.name}: waits for GPU memory still held by pods being released"
            deferred.append(wait)
            reasons[job.key] = wait
            continue
        reason = f"{window_label}: fits the offline share {offline_budget} MiB (priority {job.priority})"
        reasons[job.key] = reason
        actions.append(Action("Resume", OFFLINE_KIND, job.namespace, job.name, reason))

    actions.sort(key=lambda a: _ACTION_ORDER[a.action])  # stable: keeps priority order within a kind

    job_state: dict[tuple[str, str], str] = {}
    for job in offline:
        if job.finished:
            job_state[job.key] = "Finished"
        elif not suspended[job.key]:
            job_state[job.key] = "Running"
        elif target_running[job.key]:
            job_state[job.key] = "Waiting"
        else:
            job_state[job.key] = "Suspended"

    online_after, offline_after = asked_online(), asked_offline()
    return Plan(
        window=resolution.window,
        shares=resolution.shares,
        next_change=resolution.next_change,
        pool_nodes=len(usable),
        pool_mib=pool_mib,
        online_budget_mib=online_budget,
        offline_budget_mib=offline_budget,
        caps=dict(allowed),
        targets=target_caps,
        job_running={k: not v for k, v in suspended.items()},
        job_state=job_state,
        reasons=reasons,
        actions=actions,
        asked_before_mib=asked_before,
        asked_after_mib=online_after + offline_after,
        asked_online_mib=online_after,
        asked_offline_mib=offline_after,
        deferred=deferred,
    )
