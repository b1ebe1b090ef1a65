"""Kubernetes objects (plain dicts, camelCase as the API returns them) -> planner inputs.

Pure: the controller lists nodes, members and their pods, and passes them here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from chattts_operator.api.sharepolicy import OFFLINE_PRIORITY_ANNOTATION, REPLICA_CAP_ANNOTATION, LabelSelector
from chattts_operator.sharepolicy.planner import OfflineMember, OnlineMember, PoolNode
from chattts_operator.api.common import bytes_to_mib
from chattts_operator.deployment.gpu import DEFAULT_GPU_CODEC, GpuCodec
from chattts_operator.sharepolicy.resources import node_is_usable, selector_matches

_FINISHED_PHASES = ("Succeeded", "Failed")


class MemberError(ValueError):
    """A member object the planner cannot size; reported in the policy's status."""


def pool_nodes(nodes: Iterable[Mapping[str, Any]], gpu: GpuCodec = DEFAULT_GPU_CODEC) -> list[PoolNode]:
    """Nodes with GPU memory; usable ones (Ready, schedulable) count in the pool."""
    pool = []
    for node in nodes:
        mib = gpu.node_memory_mib(node)
        if mib > 0:
            pool.append(PoolNode(node["metadata"]["name"], mib, node_is_usable(node)))
    return sorted(pool, key=lambda n: n.name)


def largest_gpu_mib(nodes: Iterable[Mapping[str, Any]], gpu: GpuCodec = DEFAULT_GPU_CODEC) -> int:
    """Per-GPU memory of the pool's biggest GPU: what a whole-GPU request is counted as
    (the larger guess never under-counts what a member holds)."""
    return max((gpu.per_gpu_memory_mib(n) for n in nodes), default=0)


def split_by_pool(pods: Iterable[Mapping[str, Any]], pool: set[str]) -> tuple[list[Mapping[str, Any]],
                                                                                list[Mapping[str, Any]]]:
    """(pods bound to a pool node or not bound yet, live pods bound to a node outside the pool).
    A pod not bound yet counts against the pool: it may land there. One outside holds none of
    the pool's memory, so it is not counted, but reported (``pods_outside_pool``)."""
    inside, outside = [], []
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node not in pool:
            if (pod.get("status") or {}).get("phase") not in _FINISHED_PHASES:
                outside.append(pod)
        else:
            inside.append(pod)
    return inside, outside


def live_pods(pods: Iterable[Mapping[str, Any]]) -> int:
    """Pods that hold (or may soon hold) GPU memory: everything not finished, terminating included."""
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") not in _FINISHED_PHASES)


def _int_annotation(obj: Mapping[str, Any], key: str) -> int | None:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


@dataclass(frozen=True)
class Claims:
    """A namespace's ResourceClaims and ResourceClaimTemplates by name (dra members)."""

    claims: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    templates: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, claims: Iterable[Mapping[str, Any]], templates: Iterable[Mapping[str, Any]]) -> "Claims":
        return cls({c["metadata"]["name"]: c for c in claims}, {t["metadata"]["name"]: t for t in templates})


NO_CLAIMS = Claims()


def pod_memory_mib(pod: Mapping[str, Any], per_gpu_mib: int, codec: GpuCodec, claims: Claims,
                   counted: set[str]) -> int:
    """MiB one pod holds or asks, counted once whatever the profile: its containers' extended
    resources plus its ResourceClaims (allocated: what the allocation consumed; not yet: what
    they request). A claim shared by pods counts for the first (``counted``)."""
    return (codec.pod_spec_memory_mib(pod.get("spec"), per_gpu_mib)
            + codec.pod_claims_memory_mib(pod, claims.claims, claims.templates, per_gpu_mib, counted))


def online_member(
    ctd: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    per_gpu_mib: int,
    deployment: Mapping[str, Any] | None = None,
    codec: GpuCodec = DEFAULT_GPU_CODEC,
    claims: Claims = NO_CLAIMS,
    outside: int = 0,
) -> OnlineMember:
    """A ChatTTSDeployment as an online member.

    Pods it holds: its serving pods that exist, or as many as its Deployment is set to run
    (``spec.replicas``, ``status.replicas``) if more: a cap just lowered takes effect only
    when the Deployment has been scaled and its pods are gone.

    MiB per replica: the GPU resources the operator resolved for its pods
    (``status.gpu.limits``) when known, else ``spec.gpu.memory x spec.gpu.count``.
    A pod that holds more (a rollout between profiles, the dra profile's allocated claims,
    each pod counted once by what it asked) raises MiB per replica to what it holds.
    Replicas wanted: ``spec.autoscaling.maxReplicas`` when autoscaling is on (the cap
    clamps the autoscaler), else ``spec.replicas``. ``outside``: its live pods on nodes outside
    the pool (not in ``pods``), which the Deployment's replicas count but the pool does not."""
    meta = ctd["metadata"]
    spec = ctd.get("spec") or {}
    gpu = spec.get("gpu") or {}
    limits = ((ctd.get("status") or {}).get("gpu") or {}).get("limits") or {}
    per_replica = codec.container_memory_mib({"limits": limits}, per_gpu_mib) if limits else 0
    if per_replica <= 0:
        try:
            per_replica = bytes_to_mib(gpu.get("memory")) * int(gpu.get("count", 1))
        except (TypeError, ValueError):
            raise MemberError(
                f"ChatTTSDeployment {meta['namespace']}/{meta['name']}: spec.gpu.memory {gpu.get('memory')!r} "
                "is not a quantity"
            ) from None
    counted: set[str] = set()
    held = [pod_memory_mib(p, per_gpu_mib, codec, claims, counted) for p in pods
            if (p.get("status") or {}).get("phase") not in _FINISHED_PHASES]
    per_replica = max([per_replica, *held])
    autoscaling = spec.get("autoscaling") or {}
    if autoscaling.get("enabled"):
        wanted = int(autoscaling.get("maxReplicas", spec.get("replicas", 1)))
    else:
        wanted = int(spec.get("replicas", 1))
    return OnlineMember(
        namespace=meta["namespace"],
        name=meta["name"],
        per_replica_mib=per_replica,
        wanted_replicas=max(wanted, 0),
        current_cap=_int_annotation(ctd, REPLICA_CAP_ANNOTATION),
        observed_pods=max(live_pods(pods), _deployment_replicas(deployment) - outside),
    )


def _deployment_replicas(deployment: Mapping[str, Any] | None) -> int:
    if not deployment:
        return 0
    spec = int((deployment.get("spec") or {}).get("replicas", 1) or 0)
    status = int((deployment.get("status") or {}).get("replicas", 0) or 0)
    return max(spec, status)


def job_finished(job: Mapping[str, Any]) -> bool:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return True
    return False


def offline_member(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], per_gpu_mib: int,
                   codec: GpuCodec = DEFAULT_GPU_CODEC, claims: Claims = NO_CLAIMS) -> OfflineMember:
    """A batch/v1 Job as an offline member: its pod template's GPU memory (extended resources
    and claim templates) x the pods it runs at once (parallelism, no more than the
    completions still to go); a pod whose claims hold more raises it."""
    meta = job["metadata"]
    spec = job.get("spec") or {}
    status = job.get("status") or {}
    per_pod = pod_memory_mib({"spec": (spec.get("template") or {}).get("spec") or {}}, per_gpu_mib, codec, claims,
                             set())
    counted: set[str] = set()
    per_pod = max([per_pod, *(pod_memory_mib(p, per_gpu_mib, codec, claims, counted) for p in pods
                              if (p.get("status") or {}).get("phase") not in _FINISHED_PHASES)])
    parallelism = int(spec.get("parallelism", 1))
    completions = spec.get("completions")
    if completions is not None:
        parallelism = min(parallelism, max(int(completions) - int(status.get("succeeded", 0)), 0))
    return OfflineMember(
        namespace=meta["namespace"],
        name=meta["name"],
        per_pod_mib=per_pod,
        parallelism=parallelism,
        suspended=bool(spec.get("suspend", False)),
        priority=_int_annotation(job, OFFLINE_PRIORITY_ANNOTATION) or 0,
        created=meta.get("creationTimestamp", "") or "",
        finished=job_finished(job),
        observed_pods=live_pods(pods),
    )


def shared_nodes(
    pool: Iterable[Mapping[str, Any]], others: Mapping[str, LabelSelector]
) -> dict[str, list[str]]:
    """Other policies whose node selector also picks nodes of this pool: {policy: [node, ...]}.
    Two policies handing out the same GPUs could together over-commit them."""
    found: dict[str, list[str]] = {}
    for other, selector in sorted(others.items()):
        names = sorted(n["metadata"]["name"] for n in pool if selector_matches(selector, n["metadata"].get("labels")))
        if names:
            found[other] = names
    return found
