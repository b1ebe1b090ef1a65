"""One effective spec and what it wants, pure: (object, settings, node capacity) -> the
children to apply; and whether a live child needs an apply. Status is in status.py.

A spec that cannot start (the GPU memory plan does not fit, no MIG profile or node is big
enough) is *blocked*: its ConfigMap and Deployment are not applied, so whatever serves
keeps serving, and status says why (GPUCapacity=False, Degraded=True).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from chattts_operator.api.chattts import KIND, ChatTTSDeploymentSpec, validate_name
from chattts_operator.api.common import parse_quantity
from chattts_operator.api.sharepolicy import POOL_AFFINITY_ANNOTATION, REPLICA_CAP_ANNOTATION
from chattts_operator.core.labels import INTENT_HASH_ANNOTATION
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.children import (
    Owner,
    deployment_name,
    is_runtime_configmap_name,
    mounted_configmap,
    build_configmap,
    build_deployment,
    build_network_policy,
    build_pdb,
    build_resource_claim_template,
    build_service,
    config_hash,
)
from chattts_operator.deployment.gpu import GpuAssignment, GpuAssignmentError, assign_gpu
from chattts_operator.deployment.memory import MemoryPlanResult, plan_memory



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


def effective_spec(body: dict[str, Any], spec: ChatTTSDeploymentSpec) -> ChatTTSDeploymentSpec:
    """``spec`` (a ChatTTSDeploymentSpec) with the tuned maxNumBatchedTokens applied, when
    batch-token tuning is enabled and has raised it; otherwise ``spec`` unchanged."""
    auto = spec.autoscaling
    if auto is None or not auto.batch_token_tuning.enabled:
        return spec
    tuned = (((body.get("status") or {}).get("autoscaling") or {}).get("batchTokenTuning") or {}).get(
        "maxNumBatchedTokens")
    if not isinstance(tuned, int) or tuned <= (spec.engine.max_num_batched_tokens or 0):
        return spec
    if auto.batch_token_tuning.cap is not None and tuned > auto.batch_token_tuning.cap:
        tuned = auto.batch_token_tuning.cap  # the cap was lowered since: respect it at once
        if tuned <= (spec.engine.max_num_batched_tokens or 0):
            return spec
    engine = spec.engine.model_copy(update={"max_num_batched_tokens": tuned})
    return spec.model_copy(update={"engine": engine})


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


_NODE_OPERATORS = {"In", "NotIn", "Exists", "DoesNotExist"}


def pool_affinity(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The node-affinity requirements a GPUSharePolicy asks for (its pool's selector, written
    onto its members; api/sharepolicy.py POOL_AFFINITY_ANNOTATION); [] when none or unreadable."""
    raw = (body.get("metadata", {}).get("annotations") or {}).get(POOL_AFFINITY_ANNOTATION)
    try:
        items = json.loads(raw) if raw else []
    except ValueError:
        return []
    if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("key"), str) and i.get("operator") in _NODE_OPERATORS
            and all(isinstance(v, str) for v in i.get("values") or []) for i in items):
        return []
    return [{k: v for k, v in i.items() if k in ("key", "operator", "values")} for i in items]


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
    network_policy: dict[str, Any] | None = None  # None: none wanted (one left from before is deleted)
    resource_claim_template: dict[str, Any] | None = None  # the dra profile's; stale ones are deleted

    @property
    def rollout_allowed(self) -> bool:
        return self.capacity.fits

    def children(self) -> list[dict[str, Any]]:
        """The objects to apply, all at the same time: the ConfigMap and the ResourceClaimTemplate
        are content-addressed (a new content is a new name, which the pod template names), so a
        pod that starts before them waits for them and never runs with another config. A
        blocked spec applies only the Service, the PDB and the NetworkPolicy (they cannot break
        serving pods)."""
        out = []
        if self.rollout_allowed:
            out.append(self.configmap)
            if self.resource_claim_template is not None:
                out.append(self.resource_claim_template)
            assert self.deployment is not None
            out.append(self.deployment)
        out += [self.service, self.pdb]
        if self.network_policy is not None:
            out.append(self.network_policy)
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
    chash = config_hash(configmap["data"])
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
        build_deployment(owner, spec, gpu, settings, config_hash_value=chash, replicas=replicas,
                         pool_requirements=pool_affinity(body))
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
        network_policy=build_network_policy(owner, spec),
        resource_claim_template=(build_resource_claim_template(owner, gpu.dra)
                                 if gpu is not None and gpu.dra is not None else None),
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
        return all(is_subset(want, have, path) for want, have in zip(desired, live))
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


# --- runtime ConfigMaps no one needs any more ----------------------------------------------


def _controlled_by(obj: dict[str, Any], kind: str, name: str, uid: str | None = None) -> bool:
    return any(ref.get("kind") == kind and ref.get("name") == name and ref.get("controller")
               and (uid is None or ref.get("uid") == uid)
               for ref in obj.get("metadata", {}).get("ownerReferences") or [])


def stale_runtime_configmaps(owner: Owner, in_use: set[str], configmaps: list[dict[str, Any]],
                             replicasets: list[dict[str, Any]]) -> list[str]:
    """Names of ``owner``'s runtime ConfigMaps that nothing needs any more: not in ``in_use``
    (the one wanted now, the one the live Deployment mounts) and mounted by no ReplicaSet of
    its Deployment that still exists. Scaled-down ReplicaSets count too: the Deployment keeps
    ``revisionHistoryLimit`` of them, so every revision ``kubectl rollout undo`` can go back to
    finds its config, and a ConfigMap goes when the Deployment prunes its last ReplicaSet.
    Only ConfigMaps this object controls (owner uid) with a runtime ConfigMap's name."""
    kept = set(in_use)
    for rs in replicasets:
        if _controlled_by(rs, "Deployment", deployment_name(owner.name)):
            kept.add(mounted_configmap(rs) or "")
    return sorted(cm["metadata"]["name"] for cm in configmaps
                  if is_runtime_configmap_name(owner.name, cm["metadata"]["name"])
                  and _controlled_by(cm, KIND, owner.name, owner.uid)
                  and cm["metadata"]["name"] not in kept
                  and not cm["metadata"].get("deletionTimestamp"))
