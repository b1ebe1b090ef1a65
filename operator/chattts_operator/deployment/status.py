"""A ChatTTSDeployment's status, pure: (what was wanted, what the reconcile saw and did, the
previous status, now) -> the status fields this operator owns; which transitions are Events."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chattts_operator.api.sharepolicy import SHARE_POLICY_LABEL
from chattts_operator.core.conditions import condition, merge_conditions
from chattts_operator.core.labels import selector_string
from chattts_operator.deployment.pods import PodProblem, pod_problems, summary
from chattts_operator.deployment.spec import Desired

CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "GPUCapacity", "APIKeys", "GPUAllocated", "Protected", "SharePolicy",
                   "UpstreamData")
# Observed.api_keys_secret: what the reconciler found of spec.auth's Secret.
SECRET_FOUND, SECRET_MISSING, SECRET_UNCHECKED = "found", "missing", "unchecked"
# Conditions whose True is bad news: their transitions to True are Warning events.
_ABNORMAL_TRUE = {"Degraded"}
_ABNORMAL_FALSE = {"GPUCapacity", "Ready", "APIKeys", "GPUAllocated", "Protected", "SharePolicy", "UpstreamData"}
# Ready, Progressing and Degraded say this when spec.networkPolicy could not be applied.
PROTECTION_NOT_APPLIED = "ProtectionNotApplied"


@dataclass
class Observed:
    """What the reconciler saw and did this time."""

    live_deployment: dict[str, Any] | None
    deployment_applied: bool = False  # the desired Deployment is now what the cluster has
    apply_error: str | None = None
    # The NetworkPolicy was refused (the API server's words); held: a policy of ours applied
    # before still fences the pods, which keep serving the last protected generation; else the
    # Deployment is at 0 replicas.
    protection_error: str | None = None
    protection_held: bool = False
    share_policy: tuple[str, bool] | None = None  # (the label's GPUSharePolicy, whether it exists); None: no label
    api_keys_secret: str | None = None  # SECRET_*; None: spec.auth is unset
    dra: dict[str, Any] | None = None  # dra profile: status.gpu.dra (gpu.dra_allocation_status)
    unschedulable: str | None = None  # dra profile: the scheduler's word on a serving pod that waits
    pods: list[dict[str, Any]] = field(default_factory=list)  # the serving pods (from the cache)
    upstream: HealthAnswer | None = None  # a Ready pod's /health; None: not asked yet by this process


@dataclass(frozen=True)
class HealthAnswer:
    """What one Ready serving pod's /health said (its JSON), or why it could not be read;
    ``pod`` None: there was no Ready serving pod to ask."""

    pod: str | None
    health: Any = None
    error: str | None = None


# The runtime's /health ``upstream_data.missing`` items (chattts_runtime.service.UPSTREAM_ITEMS)
# and what a user notices without them; an item not known here is named all the same.
UPSTREAM_ITEMS = {
    "homophones": "rare Chinese characters are not replaced as upstream's",
    "speaker_stats": "voice presets answer 400",
    "normalizer_zh": "Chinese digits, dates and amounts are dropped, not spoken",
    "normalizer_en": "English digits, dates and amounts are dropped, not spoken",
}


def upstream_data_condition(answer: HealthAnswer, gen: int) -> dict[str, Any]:
    """UpstreamData: whether the serving pods found the upstream data their config asks for
    (homophone table, speaker statistics, language normalizers), from one Ready pod's /health.
    Informational: speech works without them, so it never changes Ready, Degraded or phase."""
    if answer.pod is None:
        return condition("UpstreamData", "Unknown", "NoReadyPod",
                         "no Ready serving pod to ask which upstream data it found", generation=gen)
    if answer.error is not None:
        return condition("UpstreamData", "Unknown", "HealthUnreadable",
                         f"pod {answer.pod}: {answer.error}"[:1024], generation=gen)
    data = answer.health.get("upstream_data") if isinstance(answer.health, dict) else None
    missing = data.get("missing") if isinstance(data, dict) else None
    if not isinstance(missing, list) or not all(isinstance(m, str) for m in missing):
        return condition("UpstreamData", "Unknown", "NotReported",
                         f"pod {answer.pod}'s /health does not say which upstream data it found "
                         "(a runtime image older than the operator?)", generation=gen)
    if missing:
        effects = "; ".join(f"{m}: {UPSTREAM_ITEMS[m]}" if m in UPSTREAM_ITEMS else m for m in missing)
        return condition("UpstreamData", False, "UpstreamDataMissing",
                         f"pod {answer.pod} did not find {', '.join(missing)} ({effects}); speech works, not as "
                         "upstream's: the pod's log says where it looked"[:1024], generation=gen)
    return condition("UpstreamData", True, "Found", "the newest Ready serving pod found the homophone table, "
                     "speaker statistics and language normalizers its config asks for", generation=gen)


def unschedulable_message(pods: list[dict[str, Any]]) -> str | None:
    """The scheduler's reason for the first serving pod it could not place (PodScheduled=False)."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return f"pod {pod['metadata']['name']} {cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}"
    return None


def rollout_complete(dep: dict[str, Any] | None) -> bool:
    return dep is not None and _rollout(dep)[0]


def _gpu_allocated_condition(desired: Desired, observed: Observed, gen: int) -> dict[str, Any] | None:
    """GPUAllocated (dra profile): whether the scheduler allocated every serving pod's claim,
    with its reason when it could not."""
    dra = observed.dra
    if dra is None or desired.gpu is None or desired.gpu.dra is None:
        return None
    if observed.unschedulable:
        return condition("GPUAllocated", False, "Unschedulable", observed.unschedulable[:1024], generation=gen)
    if dra["allocatedClaims"] < dra["claims"]:
        return condition("GPUAllocated", False, "Pending",
                         f"{dra['allocatedClaims']}/{dra['claims']} claims allocated", generation=gen)
    return condition("GPUAllocated", True, "Allocated",
                     f"{dra['allocatedClaims']} claims allocated, {dra['allocatedMemoryMiB']} MiB on "
                     f"{len(dra['devices'])} devices", generation=gen)


def transitions(previous: list[dict[str, Any]], current: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for every condition whose status changed."""
    before = {c.get("type"): c.get("status") for c in previous or []}
    events = []
    for cond in current:
        if before.get(cond["type"]) == cond["status"]:
            continue
        bad = (cond["type"] in _ABNORMAL_TRUE and cond["status"] == "True") or (
            cond["type"] in _ABNORMAL_FALSE and cond["status"] == "False" and cond["reason"] not in _QUIET_REASONS
        )
        if before.get(cond["type"]) is None and not bad:
            continue  # a new object's first, unremarkable conditions are not news
        events.append(("Warning" if bad else "Normal", f"{cond['type']}{cond['status']}",
                       f"{cond['reason']}: {cond['message']}" if cond["message"] else cond["reason"]))
    return events


# Ready=False for these reasons is expected, not a warning.
_QUIET_REASONS = {"ScaledToZero", "ReplicasNotReady", "Creating", "Pending"}


def _deployment_numbers(dep: dict[str, Any] | None) -> dict[str, int]:
    st = (dep or {}).get("status") or {}
    return {
        "replicas": int(st.get("replicas") or 0),
        "readyReplicas": int(st.get("readyReplicas") or 0),
        "updatedReplicas": int(st.get("updatedReplicas") or 0),
        "availableReplicas": int(st.get("availableReplicas") or 0),
    }


def _rollout(dep: dict[str, Any]) -> tuple[bool, str]:
    """(complete, message) in the sense of `kubectl rollout status`."""
    meta, spec, st = dep.get("metadata", {}), dep.get("spec", {}), dep.get("status") or {}
    wanted = int(spec.get("replicas", 1))
    if int(st.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
        return False, "the Deployment controller has not seen the latest Deployment yet"
    updated = int(st.get("updatedReplicas") or 0)
    total = int(st.get("replicas") or 0)
    available = int(st.get("availableReplicas") or 0)
    if updated < wanted:
        return False, f"{updated} of {wanted} replicas updated"
    if total > updated:
        return False, f"{total - updated} old replicas pending termination"
    if available < updated:
        return False, f"{available} of {updated} updated replicas available"
    return True, f"{wanted} replicas up to date"


def _stuck_pods(observed: Observed, dep: dict[str, Any], wanted: int) -> list[PodProblem]:
    """The pods' own reasons, while the rollout is not complete or replicas are missing."""
    complete, _ = _rollout(dep)
    if complete and _deployment_numbers(dep)["readyReplicas"] >= wanted:
        return []
    return pod_problems(observed.pods)


def _deployment_failure(dep: dict[str, Any]) -> str | None:
    for cond in (dep.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return f"ReplicaFailure: {cond.get('message', '')}"
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return f"ProgressDeadlineExceeded: {cond.get('message', '')}"
    return None


def _api_keys_condition(desired: Desired, observed: Observed, gen: int) -> dict[str, Any] | None:
    """APIKeys: whether spec.auth's Secret exists (without it the pods wait in
    ContainerCreating); none when spec.auth is unset."""
    auth = desired.spec.auth
    if auth is None:
        return None
    where = f"Secret {desired.owner.namespace}/{auth.secret_name}"
    if observed.api_keys_secret == SECRET_FOUND:
        return condition("APIKeys", True, "SecretFound", f"{where} is mounted at the serving pods", generation=gen)
    if observed.api_keys_secret == SECRET_MISSING:
        return condition("APIKeys", False, "SecretNotFound",
                         f"{where} does not exist: new serving pods wait in ContainerCreating until it is created",
                         generation=gen)
    return condition("APIKeys", "Unknown", "SecretNotChecked",
                     f"whether {where} exists is not checked: the operator may not get Secrets "
                     "(operator setting api_key_secret_check, chart value rbac.apiKeySecretCheck)", generation=gen)


def _share_policy_condition(name: str, exists: bool, gen: int) -> dict[str, Any]:
    """SharePolicy: whether the GPUSharePolicy the label names exists (no silent typo)."""
    if exists:
        return condition("SharePolicy", True, "PolicyFound", f"a member of GPUSharePolicy {name}", generation=gen)
    return condition("SharePolicy", False, "PolicyNotFound",
                     f"label {SHARE_POLICY_LABEL} names GPUSharePolicy {name}, which does not exist: no policy caps "
                     "or confines this object (create the policy or fix the label)", generation=gen)


def _protection_message(observed: Observed) -> str:
    fence = ("the serving pods keep the NetworkPolicy applied before, at the generation rolled out then"
             if observed.protection_held else "no pod serves without it (the Deployment is scaled to 0)")
    return f"{observed.protection_error}; {fence}"


def compute_status(
    desired: Desired,
    observed: Observed,
    previous: dict[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The status fields this operator owns (others, e.g. autoscaling, are left alone)."""
    previous = previous or {}
    gen = desired.generation
    dep = observed.live_deployment
    numbers = _deployment_numbers(dep)
    cap = desired.capacity
    blocked = not cap.fits

    if blocked:
        applied_generation = previous.get("appliedGeneration")
        applied_hash = previous.get("configHash", "")
    elif observed.deployment_applied:
        applied_generation, applied_hash = gen, desired.config_hash
    else:
        applied_generation = previous.get("appliedGeneration")
        applied_hash = previous.get("configHash", "")

    wanted = int((dep or {}).get("spec", {}).get("replicas", desired.replicas)) if dep else desired.replicas
    unprotected = observed.protection_error
    stuck = (_stuck_pods(observed, dep, wanted)
             if dep is not None and not blocked and not observed.apply_error and not unprotected else [])
    why = summary(stuck)

    capacity_message = cap.message + "".join(f"; warning: {w}" for w in cap.warnings)
    conditions = [condition("GPUCapacity", cap.fits, cap.reason, capacity_message, generation=gen)]

    # Progressing
    if blocked:
        kept = f"generation {applied_generation} keeps serving" if dep is not None else "nothing was rolled out"
        progressing = condition("Progressing", False, "RolloutBlocked",
                                f"generation {gen} cannot start ({cap.reason}); {kept}", generation=gen)
    elif unprotected:
        progressing = condition("Progressing", False, PROTECTION_NOT_APPLIED,
                                f"generation {gen} is not rolled out: {unprotected}", generation=gen)
    elif observed.apply_error:
        progressing = condition("Progressing", False, "ApplyFailed", observed.apply_error, generation=gen)
    elif dep is None:
        progressing = condition("Progressing", True, "Creating", "creating the Deployment", generation=gen)
    else:
        complete, message = _rollout(dep)
        reason = "Complete" if complete else stuck[0].reason if stuck else "RollingOut"
        progressing = condition("Progressing", not complete, reason,
                                f"{message}; {why}" if stuck and not complete else message, generation=gen)
    conditions.append(progressing)

    api_keys = _api_keys_condition(desired, observed, gen)
    if api_keys is not None:
        conditions.append(api_keys)
    allocated = _gpu_allocated_condition(desired, observed, gen)
    if allocated is not None:
        conditions.append(allocated)
    if observed.share_policy is not None:
        conditions.append(_share_policy_condition(*observed.share_policy, gen))
    if observed.upstream is not None:
        conditions.append(upstream_data_condition(observed.upstream, gen))
    else:
        # Not asked yet by this process (it just started): what an earlier one found stands.
        kept = next((c for c in previous.get("conditions") or [] if c.get("type") == "UpstreamData"), None)
        conditions.append(kept or condition("UpstreamData", "Unknown", "NotChecked",
                                            "no serving pod asked yet (the operator asks one Ready pod's /health "
                                            "every upstream_data_interval_seconds; 0: never)", generation=gen))
    if unprotected:
        conditions.append(condition("Protected", False, PROTECTION_NOT_APPLIED, _protection_message(observed),
                                    generation=gen))
    elif desired.network_policy is not None:
        conditions.append(condition("Protected", True, "NetworkPolicyApplied",
                                    f"NetworkPolicy {desired.network_policy['metadata']['name']} fences the "
                                    "serving pods", generation=gen))

    # Degraded
    failure = _deployment_failure(dep) if dep is not None else None
    if blocked:
        degraded = condition("Degraded", True, cap.reason,
                              f"spec generation {gen} is not rolled out: {cap.message}", generation=gen)
    elif unprotected:
        degraded = condition("Degraded", True, PROTECTION_NOT_APPLIED, unprotected, generation=gen)
    elif observed.apply_error:
        degraded = condition("Degraded", True, "ApplyFailed", observed.apply_error, generation=gen)
    elif stuck:
        degraded = condition("Degraded", True, stuck[0].reason, why, generation=gen)
    elif failure:
        degraded = condition("Degraded", True, failure.split(":", 1)[0], failure, generation=gen)
    elif api_keys is not None and api_keys["status"] == "False":
        degraded = condition("Degraded", True, api_keys["reason"], api_keys["message"], generation=gen)
    else:
        degraded = condition("Degraded", False, "AsExpected", "", generation=gen)
    conditions.append(degraded)

    # Ready: as many ready pods as wanted (counting from the live Deployment).
    ready_n = numbers["readyReplicas"]
    if unprotected:
        # Never Ready without the fence asked for, whatever pods the held generation has.
        ready = condition("Ready", False, PROTECTION_NOT_APPLIED, _protection_message(observed), generation=gen)
    elif dep is None:
        ready = condition("Ready", False, "Creating" if not blocked else cap.reason, "no Deployment yet", generation=gen)
    elif wanted == 0:
        ready = condition("Ready", False, "ScaledToZero", "0 replicas wanted", generation=gen)
    elif ready_n >= wanted:
        ready = condition("Ready", True, "AllReplicasReady", f"{ready_n}/{wanted} replicas ready", generation=gen)
    elif stuck:
        ready = condition("Ready", False, stuck[0].reason, f"{ready_n}/{wanted} replicas ready; {why}", generation=gen)
    else:
        ready = condition("Ready", False, "ReplicasNotReady", f"{ready_n}/{wanted} replicas ready", generation=gen)
    conditions.insert(0, ready)
    conditions = merge_conditions(previous.get("conditions") or [], conditions, now)

    by_type = {c["type"]: c["status"] for c in conditions}
    if by_type["Degraded"] == "True" and stuck:
        phase = stuck[0].phase  # Unschedulable, ImagePullBackOff, CrashLoopBackOff, ...
    elif by_type["Degraded"] == "True":
        phase = "Degraded" if dep is not None else "Unsatisfiable" if blocked else "Failed"
    elif by_type["Progressing"] == "True":
        phase = "Progressing"
    elif by_type["Ready"] == "True":
        phase = "Ready"
    elif dep is not None and wanted == 0:
        phase = "ScaledToZero"
    else:
        phase = "Pending"

    gpu = desired.gpu
    gpu_status = {
        "profile": gpu.profile.value,
        "limits": dict(gpu.limits),
        "nodeMinGpuMemoryMiB": gpu.node_min_gpu_memory_mib,
        "migProfile": gpu.mig_profile,
        "dra": observed.dra,
    } if gpu else None
    gpu_share = gpu.share if gpu else ""
    if blocked and dep is not None and previous.get("gpuShare"):
        # The pods that serve still have the last good share: show that, not the refused one.
        gpu_status, gpu_share = previous.get("gpu"), previous["gpuShare"]
    return {
        "observedGeneration": gen,
        "phase": phase,
        **numbers,
        "selector": selector_string(desired.owner.name),
        "gpuShare": gpu_share,
        "gpu": gpu_status,
        "memoryPlan": desired.plan.to_status() if desired.plan else None,
        "appliedGeneration": applied_generation,
        "configHash": applied_hash,
        "conditions": conditions,
    }


def status_changed(new: dict[str, Any], live_status: dict[str, Any] | None) -> bool:
    """Whether writing ``new`` would change the live status (only our keys are compared;
    keys we set to None must be absent or null there)."""
    live_status = live_status or {}
    for key, value in new.items():
        current = live_status.get(key)
        if value is None:
            if current is not None:
                return True
        elif isinstance(value, dict):
            if not isinstance(current, dict) or _strip_none(value) != _strip_none(current):
                return True
        elif value != current:
            return True
    return False


def _strip_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_none(v) for v in value]
    return value

