"""Why serving pods are not Ready, in their own words, pure: (the pods) -> problems.

The Deployment only counts replicas ("0 of 1 updated replicas available"); the reasons are on
the pods: the scheduler's PodScheduled condition (a missing PVC, a taint no pod tolerates, a
full cluster), a container's waiting state (image pull errors, crash loops, a config error),
an eviction. status.py puts the most serious one in the Ready/Progressing/Degraded
conditions and the phase, so ``kubectl get ctd`` tells it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A condition message has room for 32 KiB; a status that people read needs far less, and a
# message that changes on every scheduling attempt (node counts) must not grow without bound.
MAX_POD_MESSAGE = 300
MAX_PODS_NAMED = 3

# (reason in our conditions, phase) per kind of problem, most serious first.
EVICTED = ("PodsEvicted", "Evicted")
CRASH_LOOP = ("PodsCrashLooping", "CrashLoopBackOff")
IMAGE_PULL = ("ImagePullFailed", "ImagePullBackOff")
CONTAINER_CONFIG = ("ContainerConfigError", "ContainerConfigError")
UNSCHEDULABLE = ("PodsUnschedulable", "Unschedulable")
_SEVERITY = (EVICTED, CRASH_LOOP, IMAGE_PULL, CONTAINER_CONFIG, UNSCHEDULABLE)

_WAITING = {
    "CrashLoopBackOff": CRASH_LOOP,
    "ImagePullBackOff": IMAGE_PULL,
    "ErrImagePull": IMAGE_PULL,
    "InvalidImageName": IMAGE_PULL,
    "ErrImageNeverPull": IMAGE_PULL,
    "CreateContainerConfigError": CONTAINER_CONFIG,
    "CreateContainerError": CONTAINER_CONFIG,
    "RunContainerError": CONTAINER_CONFIG,
}


@dataclass(frozen=True)
class PodProblem:
    pod: str
    kind: tuple[str, str]  # one of the constants above
    message: str

    @property
    def reason(self) -> str:
        return self.kind[0]

    @property
    def phase(self) -> str:
        return self.kind[1]


def bounded(text: str, limit: int = MAX_POD_MESSAGE) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pod_problem(pod: dict[str, Any]) -> PodProblem | None:
    """What keeps this pod from serving, or None (Ready, starting normally, or terminating)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None
    name = meta.get("name", "?")
    if status.get("phase") == "Failed" and status.get("reason") == "Evicted":
        return PodProblem(name, EVICTED, bounded(f"evicted: {status.get('message') or 'no message'}"))
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        kind = _WAITING.get(waiting.get("reason") or "")
        if kind is not None:
            text = f"container {container.get('name')}: {waiting['reason']}"
            if waiting.get("message"):
                text += f": {waiting['message']}"
            if kind is CRASH_LOOP:
                last = (container.get("lastState") or {}).get("terminated") or {}
                if last:
                    text += f" (restarts {container.get('restartCount', 0)}, last exit {last.get('exitCode')}"
                    text += f" {last.get('reason')})" if last.get("reason") else ")"
            return PodProblem(name, kind, bounded(text))
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                and cond.get("reason") == "Unschedulable":
            return PodProblem(name, UNSCHEDULABLE, bounded(f"Pending: {cond.get('message') or 'Unschedulable'}"))
    return None


def pod_problems(pods: list[dict[str, Any]]) -> list[PodProblem]:
    """Every pod's problem, the most serious kind first (then by pod name)."""
    found = [p for p in (pod_problem(pod) for pod in pods) if p is not None]
    return sorted(found, key=lambda p: (_SEVERITY.index(p.kind), p.pod))


def summary(problems: list[PodProblem]) -> str:
    """One bounded sentence naming the pods (a few) and why, the most serious kind first."""
    named = [f"pod {p.pod}: {p.message}" for p in problems[:MAX_PODS_NAMED]]
    more = len(problems) - len(named)
    return "; ".join(named) + (f"; and {more} more pod(s)" if more > 0 else "")
