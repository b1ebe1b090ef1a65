"""The reconcile decision, pure: (object, settings, live children, node capacity, now) ->
what to apply and what status to write. The kopf handlers only do the I/O around it.

A spec that cannot start (the GPU memory plan does not fit, no MIG profile or node is big
enough) is *blocked*: its ConfigMap and Deployment are not applied, so whatever serves
keeps serving, and status says why (GPUCapacity=False, Degraded=True).
"""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from chattts_operator.api.chattts import ChatTTSDeploymentSpec, parse_quantity, validate_name
from chattts_operator.api.sharepolicy import REPLICA_CAP_ANNOTATION
from chattts_operator.builders import (
    INTENT_HASH_ANNOTATION,
    Owner,
    build_configmap,
    build_deployment,
    build_pdb,
    build_service,
    config_hash,
    selector_string,
)
from chattts_operator.autoscaling.tuning import effective_spec
from chattts_operator.gpu import GpuAssignment, GpuAssignmentError, assign_gpu
from chattts_operator.planner import MemoryPlanResult, plan_memory
from chattts_operator.settings import OperatorSettings

CONDITION_TYPES = ("Ready", "Progressing", "Degraded", "GPUCapacity")
# Conditions whose True is bad news: their transitions to True are Warning events.
_ABNORMAL_TRUE = {"Degraded"}
_ABNORMAL_FALSE = {"GPUCapacity", "Ready"}


class InvalidSpec(ValueError):
    """The object's spec fails the models' validation (the CRD should have refused it)."""


def parse_spec(body: dict[str, Any]) -> ChatTTSDeploymentSpec:
    try:
        validate_name(body["metadata"]["name"])
        return ChatTTSDeploymentSpec.model_validate(body.get("spec") or {})
    except ValidationError as err:
        problems = "; ".join(
            f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else e["msg"] for e in err.errors()
        )
        raise InvalidSpec(problems) from None
    except ValueError as err:
        raise InvalidSpec(str(err)) from None


def effective_replicas(body: dict[str, Any], spec: ChatTTSDeploymentSpec) -> tuple[int, str | None]:
    """spec.replicas, capped by a GPU share policy's replica cap annotation when present."""
    cap_text = (body.get("metadata", {}).get("annotations") or {}).get(REPLICA_CAP_ANNOTATION)
    if cap_text is None:
        return spec.replicas, None
    try:
        cap = int(cap_text)
    except ValueError:
        return spec.replicas, None
    if cap < 0 or cap >= spec.replicas:
        return spec.replicas, None
    return cap, f"capped to {cap} by the GPU share policy (spec.replicas {spec.replicas})"


@dataclass(frozen=True)
class Capacity:
    fits: bool
    reason: str
    message: str
    warnings: tuple[str, ...] = ()


@dataclass
class Desired:
    """Everything the reconciler wants, before looking at the cluster."""

    owner: Owner
    generation: int
    spec: ChatTTSDeploymentSpec
    replicas: int
    replica_note: str | None
    gpu: GpuAssignment | None
    plan: MemoryPlanResult | None
    capacity: Capacity
    configmap: dict[str, Any]
    deployment: dict[str, Any] | None
    service: dict[str, Any]
    pdb: dict[str, Any]
    config_hash: str

    @property
    def rollout_allowed(self) -> bool:
        return self.capacity.fits

    def children(self) -> list[dict[str, Any]]:
        """The objects to apply, in order: the ConfigMap before the Deployment that mounts it.
        A blocked spec applies only the Service and the PDB (they cannot break serving pods)."""
        out = []
        if self.rollout_allowed:
            out.append(self.configmap)
            assert self.deployment is not None
            out.append(self.deployment)
        out += [self.service, self.pdb]
        return out


def desired_state(
    body: dict[str, Any],
    spec: ChatTTSDeploymentSpec,
    settings: OperatorSettings,
    *,
    largest_node_gpu_mib: int | None,
) -> Desired:
    meta = body["metadata"]
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
    spec = effective_spec(body, spec)  # the autoscaler's tuned maxNumBatchedTokens, when opted in
    replicas, replica_note = effective_replicas(body, spec)
    configmap = build_configmap(owner, spec)
    chash = config_hash(configmap)
    gpu: GpuAssignment | None = None
    plan: MemoryPlanResult | None = None
    try:
        gpu = assign_gpu(spec.gpu, settings)
    except GpuAssignmentError as err:
        capacity = Capacity(False, err.reason, str(err))
    else:
        plan = plan_memory(
            shape=spec.model.shape,
            weight_format=spec.model.format,
            engine=spec.engine,
            gpu_memory_mib=gpu.memory_per_gpu_mib,
            tensor_parallel=spec.gpu.count,
            utilization_warning=settings.utilization_warning,
        )
        if not plan.fits:
            capacity = Capacity(False, plan.reason, plan.message, tuple(plan.warnings))
        elif (
            largest_node_gpu_mib is not None
            and gpu.node_min_gpu_memory_mib is not None
            and gpu.node_min_gpu_memory_mib > largest_node_gpu_mib
        ):
            capacity = Capacity(
                False,
                "NoNodeLargeEnough",
                f"gpu.memory {spec.gpu.memory} ({gpu.node_min_gpu_memory_mib} MiB per GPU) is more than the largest "
                f"GPU of any node ({largest_node_gpu_mib} MiB, node label {settings.node_memory_label})",
                tuple(plan.warnings),
            )
        else:
            capacity = Capacity(True, "Fits", plan.message, tuple(plan.warnings))
    deployment = (
        build_deployment(owner, spec, gpu, settings, config_hash_value=chash, replicas=replicas)
        if capacity.fits and gpu is not None
        else None
    )
    return Desired(
        owner=owner,
        generation=int(meta.get("generation") or 1),
        spec=spec,
        replicas=replicas,
        replica_note=replica_note,
        gpu=gpu,
        plan=plan,
        capacity=capacity,
        configmap=configmap,
        deployment=deployment,
        service=build_service(owner),
        pdb=build_pdb(owner),
        config_hash=chash,
    )


# --- comparing desired with live ------------------------------------------------------------


def _quantities_equal(a: Any, b: Any) -> bool:
    try:
        return parse_quantity(str(a)) == parse_quantity(str(b))
    except ValueError:
        return False


def is_subset(desired: Any, live: Any, path: tuple[str, ...] = ()) -> bool:
    """Whether every field we want is in the live object with the same value. Fields the
    API server or other controllers add are ignored; lists must match item by item."""
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            return False
        return all(k in live and is_subset(v, live[k], path + (k,)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, l, path) for d, l in zip(desired, live))
    if desired == live:
        return True
    # The API server writes quantities in canonical form ("0.5" -> "500m").
    if "resources" in path and isinstance(desired, (str, int)) and isinstance(live, (str, int)):
        return _quantities_equal(desired, live)
    if isinstance(desired, (int, float, Decimal)) and isinstance(live, (int, float)) and not isinstance(desired, bool):
        return float(desired) == float(live)
    return False


def needs_apply(desired: dict[str, Any], live: dict[str, Any] | None) -> bool:
    """Apply when the child is missing, our intent changed (hash), or someone edited a field we own."""
    if live is None:
        return True
    live_hash = (live.get("metadata", {}).get("annotations") or {}).get(INTENT_HASH_ANNOTATION)
    if live_hash != desired["metadata"]["annotations"][INTENT_HASH_ANNOTATION]:
        return True
    return not is_subset(desired, live)


# --- status --------------------------------------------------------------------------------


@dataclass
class Observed:
    """What the reconciler saw and did this time."""

    live_deployment: dict[str, Any] | None
    deployment_applied: bool = False  # the desired Deployment is now what the cluster has
    apply_error: str | None = None


def _condition(ctype: str, status: bool | str, reason: str, message: str, generation: int) -> dict[str, Any]:
    value = status if isinstance(status, str) else ("True" if status else "False")
    return {"type": ctype, "status": value, "reason": reason, "message": message, "observedGeneration": generation}


def merge_conditions(previous: list[dict[str, Any]], new: list[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """New conditions, keeping lastTransitionTime where the status did not change."""
    before = {c.get("type"): c for c in previous or []}
    out = []
    for cond in new:
        old = before.get(cond["type"])
        stamp = old.get("lastTransitionTime") if old and old.get("status") == cond["status"] else None
        out.append({**cond, "lastTransitionTime": stamp or now})
    return out


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
_QUIET_REASONS = {"ScaledToZero", "ReplicasNotReady", "Creating"}


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


def _deployment_failure(dep: dict[str, Any]) -> str | None:
    for cond in (dep.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "ReplicaFailure" and cond.get("status") == "True":
            return f"ReplicaFailure: {cond.get('message', '')}"
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            return f"ProgressDeadlineExceeded: {cond.get('message', '')}"
    return None


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

    capacity_message = cap.message + "".join(f"; warning: {w}" for w in cap.warnings)
    conditions = [_condition("GPUCapacity", cap.fits, cap.reason, capacity_message, gen)]

    # Progressing
    if blocked:
        kept = f"generation {applied_generation} keeps serving" if dep is not None else "nothing was rolled out"
        progressing = _condition("Progressing", False, "RolloutBlocked",
                                 f"generation {gen} cannot start ({cap.reason}); {kept}", gen)
    elif observed.apply_error:
        progressing = _condition("Progressing", False, "ApplyFailed", observed.apply_error, gen)
    elif dep is None:
        progressing = _condition("Progressing", True, "Creating", "creating the Deployment", gen)
    else:
        complete, message = _rollout(dep)
        progressing = _condition("Progressing", not complete, "RollingOut" if not complete else "Complete", message, gen)
    conditions.append(progressing)

    # Degraded
    failure = _deployment_failure(dep) if dep is not None else None
    if blocked:
        degraded = _condition("Degraded", True, cap.reason,
                              f"spec generation {gen} is not rolled out: {cap.message}", gen)
    elif observed.apply_error:
        degraded = _condition("Degraded", True, "ApplyFailed", observed.apply_error, gen)
    elif failure:
        degraded = _condition("Degraded", True, failure.split(":", 1)[0], failure, gen)
    else:
        degraded = _condition("Degraded", False, "AsExpected", "", gen)
    conditions.append(degraded)

    # Ready: as many ready pods as wanted (counting from the live Deployment).
    wanted = int((dep or {}).get("spec", {}).get("replicas", desired.replicas)) if dep else desired.replicas
    ready_n = numbers["readyReplicas"]
    if dep is None:
        ready = _condition("Ready", False, "Creating" if not blocked else cap.reason, "no Deployment yet", gen)
    elif wanted == 0:
        ready = _condition("Ready", False, "ScaledToZero", "0 replicas wanted", gen)
    elif ready_n >= wanted:
        ready = _condition("Ready", True, "AllReplicasReady", f"{ready_n}/{wanted} replicas ready", gen)
    else:
        ready = _condition("Ready", False, "ReplicasNotReady", f"{ready_n}/{wanted} replicas ready", gen)
    conditions.insert(0, ready)
    conditions = merge_conditions(previous.get("conditions") or [], conditions, now)

    by_type = {c["type"]: c["status"] for c in conditions}
    if by_type["Degraded"] == "True":
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

