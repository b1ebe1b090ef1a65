"""`spec.quantization` of a ChatTTSDeployment, pure: the AWQ Job it asks for and which
weights the serving pods mount (the models are in ``api/quantization.py``).

The flow, level-based (the CTD reconcile calls ``plan_quantization`` on every pass):
1. ``spec.quantization`` set and no Job for its content hash: create the Job (once; never
   re-applied, because a GPUSharePolicy may own its ``spec.suspend``). The Job runs
   ``chattts-runtime quantize`` (AutoAWQ 0.2.9, GEMM, 4-bit; ``quant_method: awq``, which
   vLLM loads) reading the fp16 weights read-only and writing into its own directory
   ``<output.subPath>/<hash>`` on the writable output PVC, so a new quantization never
   overwrites weights that pods are serving.
2. While it runs, or if it fails, the serving pods keep what they had; the ``Quantized``
   condition says why (the Job's failure message).
3. Once it succeeded, the serving pods mount ``<output.subPath>/<hash>`` read-only with
   ``format: awq``; ``status.quantization`` remembers that, so deleting the finished Job
   (TTL, cleanup) does not switch the pods back.

The Job is an offline workload: priority class ``chattts-offline`` (online pods may
preempt it) and, with ``sharePolicy`` set, created suspended and labelled into that
GPUSharePolicy, which resumes it when the offline share has room (at night, say).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from chattts_operator.api.quantization import PvcDirectory, QuantizationSpec
from chattts_operator.api.sharepolicy import OFFLINE_PRIORITY_ANNOTATION, OFFLINE_PRIORITY_CLASS, SHARE_POLICY_LABEL
from chattts_operator.core.conditions import condition
from chattts_operator.core.labels import LABEL_COMPONENT, LABEL_INSTANCE, child_labels

COMPONENT = "quantize"
CONDITION_TYPE = "Quantized"
RUNTIME_USER = 65532  # the runtime image's non-root user (deploy/images/runtime.Dockerfile)
SOURCE_MOUNT = "/models/source"
CALIBRATION_MOUNT = "/calibration"
OUTPUT_MOUNT = "/output"
HASH_LABEL = "tts.chattts.io/quantization-hash"


@dataclass(frozen=True)
class QuantizationPlan:
    """What the CTD reconcile should do about quantization on this pass."""

    state: str  # NotRequested | Pending | Suspended | Running | Succeeded | Failed | Invalid
    job_to_create: dict[str, Any] | None
    stale_jobs: list[str]  # this CTD's quantization Jobs for an older spec: delete them (propagation Background)
    model_override: dict[str, Any] | None  # spec.model (camelCase) the serving pods should use, or None: keep spec.model
    condition: dict[str, Any] | None  # the Quantized condition (None when not requested)
    status: dict[str, Any] | None  # status.quantization (camelCase), None when not requested
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message) on transitions


def spec_hash(q: QuantizationSpec, source: PvcDirectory) -> str:
    """Ten hex digits over everything that changes the output (not scheduling knobs)."""
    material = {
        "method": q.method, "source": source.model_dump(mode="json"),
        "calibration": q.calibration.model_dump(mode="json"), "output": q.output.model_dump(mode="json"),
        "wBit": q.w_bit, "groupSize": q.group_size, "nSamples": q.n_samples,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:10]


def job_name(ctd_name: str, digest: str) -> str:
    # CTD names are at most 45 characters: this stays within the 63 a Job's pods need.
    return f"{ctd_name}-awq-{digest[:8]}"


def output_sub_path(q: QuantizationSpec, digest: str) -> str:
    return f"{q.output.sub_path.rstrip('/')}/{digest}" if q.output.sub_path else digest


def resolve_source(q: QuantizationSpec, model: Mapping[str, Any]) -> PvcDirectory:
    """The fp16 weights to quantize; ValueError naming the field when there are none."""
    if q.source is not None:
        return q.source
    pvc = model.get("pvc")
    if not pvc:
        raise ValueError(
            "quantization.source is required unless spec.model is on a PVC: "
            "set quantization.source to the PVC holding the fp16 checkpoint"
        )
    if model.get("format", "fp16") != "fp16":
        raise ValueError(
            f"spec.model.format is {model.get('format')!r}: quantization needs fp16 weights; set quantization.source"
        )
    return PvcDirectory(claim_name=pvc["claimName"], sub_path=pvc.get("subPath"))


def job_selector(ctd_name: str) -> str:
    """Label selector of a ChatTTSDeployment's quantization Jobs."""
    return f"{LABEL_COMPONENT}={COMPONENT},{LABEL_INSTANCE}={ctd_name}"


GPU_CLAIM = "gpu"  # the Job pod's name for its claim (dra profile)


def labels_for(ctd_name: str) -> dict[str, str]:
    return {**child_labels(ctd_name), LABEL_COMPONENT: COMPONENT}


@dataclass(frozen=True)
class JobPlacement:
    """Where and as what the quantization Job's pod runs: its image, GPU resources (limits from the
    sharing profile, or ``gpu_claim_template``: the dra profile's ResourceClaimTemplate its pod claims
    its GPU from) and scheduling."""

    image: str
    image_pull_policy: str = "IfNotPresent"
    gpu_limits: Mapping[str, str] | None = None
    tolerations: Sequence[Mapping[str, Any]] = ()
    node_affinity: Mapping[str, Any] | None = None
    node_selector: Mapping[str, str] | None = None
    gpu_claim_template: str | None = None


def build_quantization_job(
    *,
    ctd_name: str,
    namespace: str,
    owner_uid: str,
    q: QuantizationSpec,
    source: PvcDirectory,
    digest: str,
    placement: JobPlacement,
    api_version: str = "tts.chattts.io/v1alpha1",
) -> dict[str, Any]:
    """The batch/v1 Job that quantizes. Deterministic: the same inputs give the same dict."""
    image, image_pull_policy, gpu_limits = placement.image, placement.image_pull_policy, placement.gpu_limits
    tolerations, node_affinity, node_selector = placement.tolerations, placement.node_affinity, placement.node_selector
    gpu_claim_template = placement.gpu_claim_template
    name = job_name(ctd_name, digest)
    labels = {**labels_for(ctd_name), HASH_LABEL: digest}
    annotations: dict[str, str] = {}
    if q.share_policy:
        labels[SHARE_POLICY_LABEL] = q.share_policy
        annotations[OFFLINE_PRIORITY_ANNOTATION] = str(q.priority)

    calibration_volume: dict[str, Any]
    if q.calibration.pvc is not None:
        calibration_volume = {"name": "calibration", "persistentVolumeClaim": {"claimName": q.calibration.pvc.claim_name, "readOnly": True}}
        calibration_file = f"{CALIBRATION_MOUNT}/{q.calibration.pvc.path}"
    else:
        assert q.calibration.config_map is not None
        calibration_volume = {"name": "calibration", "configMap": {"name": q.calibration.config_map.name}}
        calibration_file = f"{CALIBRATION_MOUNT}/{q.calibration.config_map.key}"

    source_mount: dict[str, Any] = {"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True}
    if source.sub_path:
        source_mount["subPath"] = source.sub_path
    output_mount: dict[str, Any] = {"name": "output", "mountPath": OUTPUT_MOUNT}
    if q.output.sub_path:
        output_mount["subPath"] = q.output.sub_path

    container: dict[str, Any] = {
        "name": "quantize",
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": ["chattts-runtime"],
        "args": [
            "quantize",
            "--model", SOURCE_MOUNT,
            "--out", f"{OUTPUT_MOUNT}/{digest}",
            "--calib", calibration_file,
            "--w-bit", str(q.w_bit),
            "--group-size", str(q.group_size),
            "--n-samples", str(q.n_samples),
        ],
        "volumeMounts": [
            source_mount,
            {"name": "calibration", "mountPath": CALIBRATION_MOUNT, "readOnly": True},
            output_mount,
            {"name": "scratch", "mountPath": "/tmp"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_OFFLINE", "value": "1"}],
    }
    if gpu_limits:
        container["resources"] = {"limits": dict(gpu_limits)}
    if gpu_claim_template:
        container["resources"] = {**container.get("resources", {}), "claims": [{"name": GPU_CLAIM}]}

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "priorityClassName": OFFLINE_PRIORITY_CLASS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_USER,
            "runAsGroup": RUNTIME_USER,
            "fsGroup": RUNTIME_USER,  # the output PVC must be writable by the runtime user
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [
            {"name": "source", "persistentVolumeClaim": {"claimName": source.claim_name, "readOnly": True}},
            calibration_volume,
            {"name": "output", "persistentVolumeClaim": {"claimName": q.output.claim_name}},
            {"name": "scratch", "emptyDir": {}},
        ],
    }
    if gpu_claim_template:
        pod_spec["resourceClaims"] = [{"name": GPU_CLAIM, "resourceClaimTemplateName": gpu_claim_template}]
    if tolerations:
        pod_spec["tolerations"] = [dict(t) for t in tolerations]
    if node_affinity:
        pod_spec["affinity"] = {"nodeAffinity": dict(node_affinity)}
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)

    job_spec: dict[str, Any] = {
        "backoffLimit": q.backoff_limit,
        "completions": 1,
        "parallelism": 1,
        # Under a share policy the Job waits until the policy admits it.
        "suspend": bool(q.share_policy),
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    if q.active_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = q.active_deadline_seconds

    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [
            {
                "apiVersion": api_version, "kind": "ChatTTSDeployment", "name": ctd_name, "uid": owner_uid,
                "controller": True, "blockOwnerDeletion": True,
            }
        ],
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job_spec}


def job_state(job: Mapping[str, Any]) -> tuple[str, str]:
    """(Pending | Suspended | Running | Succeeded | Failed, message) from a Job's status."""
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "Succeeded", cond.get("message") or ""
        if cond.get("type") == "Failed":
            return "Failed", f"{cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip(": ")
    if (job.get("spec") or {}).get("suspend"):
        return "Suspended", "waiting for its GPUSharePolicy to admit it"
    if status.get("active") or status.get("ready"):
        return "Running", ""
    return "Pending", ""


def quantized_model(model: Mapping[str, Any], q: QuantizationSpec, digest: str) -> dict[str, Any]:
    """spec.model (camelCase) with the weights switched to the quantized output, read-only."""
    return _with_pvc(model, {"claimName": q.output.claim_name, "subPath": output_sub_path(q, digest)})


def _with_pvc(model: Mapping[str, Any], pvc: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in model.items() if k not in ("pvc", "hostPath", "image")}
    out["pvc"] = dict(pvc)
    out["format"] = "awq"
    return out


def plan_quantization(
    *,
    ctd_name: str,
    namespace: str,
    owner_uid: str,
    spec: Mapping[str, Any],
    jobs: Sequence[Mapping[str, Any]],
    previous: Mapping[str, Any] | None,
    placement: JobPlacement,
    now: str = "",
    generation: int | None = None,
) -> QuantizationPlan:
    """Decide about quantization from the CTD's spec (camelCase dict), this CTD's existing
    quantization Jobs (label component=quantize) and the previous status.quantization.

    ``placement``: where and as what the Job's pod runs (its GPU resources: the sharing profile applied to
    ``quantization.gpuMemory`` or ``spec.gpu.memory``, as the deployment builder resolves them)."""
    raw = spec.get("quantization")
    if not raw:
        return QuantizationPlan("NotRequested", None, [j["metadata"]["name"] for j in jobs], None, None, None)
    previous = dict(previous or {})
    q = QuantizationSpec.model_validate(raw)
    model = spec.get("model") or {}
    try:
        source = resolve_source(q, model)
    except ValueError as err:
        condition = _condition("False", "InvalidSpec", str(err), now, generation)
        return QuantizationPlan("Invalid", None, [], None, condition, {"state": "Invalid", "message": str(err)})

    digest = spec_hash(q, source)
    name = job_name(ctd_name, digest)
    output = f"{q.output.claim_name}/{output_sub_path(q, digest)}"
    stale = [j["metadata"]["name"] for j in jobs if j["metadata"]["name"] != name]
    current = next((j for j in jobs if j["metadata"]["name"] == name), None)
    was_succeeded = previous.get("hash") == digest and previous.get("state") == "Succeeded"

    if was_succeeded:
        state, message = "Succeeded", previous.get("message", "")
    elif current is None:
        state, message = "Pending", "creating the quantization Job"
    else:
        state, message = job_state(current)

    job_to_create = None
    if current is None and not was_succeeded:
        job_to_create = build_quantization_job(
            ctd_name=ctd_name, namespace=namespace, owner_uid=owner_uid, q=q, source=source, digest=digest,
            placement=placement,
        )

    serving_quantized = state == "Succeeded"
    # A failed or unfinished new quantization keeps the weights that serve now: the last
    # successful quantization's, if any, else spec.model.
    kept = previous.get("servingPvc") if previous.get("serving") else None
    if serving_quantized:
        model_override = quantized_model(model, q, digest)
        condition = _condition(
            "True", "Succeeded", f"serving AWQ {q.w_bit}-bit weights from {output} (read-only)", now, generation
        )
    else:
        model_override = _with_pvc(model, kept) if kept else None
        keep = f"the serving pods keep the AWQ weights in {kept['claimName']}/{kept.get('subPath', '')}" if kept \
            else "the serving pods keep spec.model's weights"
        reason = {"Failed": "JobFailed", "Suspended": "WaitingForShare", "Running": "Running"}.get(state, "Pending")
        detail = f"quantization Job {name}: {state.lower()}" + (f" ({message})" if message else "")
        condition = _condition("False", reason, f"{detail}; {keep}", now, generation)

    status: dict[str, Any] = {
        "hash": digest, "state": state, "jobName": name, "output": output,
        "message": message if state != "Succeeded" else f"quantized weights in {output}",
        "serving": model_override is not None,
    }
    if model_override is not None:
        status["servingPvc"] = dict(model_override["pvc"])

    events: list[tuple[str, str, str]] = []
    if previous.get("state") != state or previous.get("hash") != digest:
        if state == "Succeeded":
            events.append(("Normal", "Quantized", f"serving pods switch to the AWQ weights in {output}"))
        elif state == "Failed":
            events.append(("Warning", "QuantizationFailed", f"Job {name} failed ({message}); serving pods keep their weights"))
        elif job_to_create is not None:
            events.append(("Normal", "QuantizationStarted", f"created Job {name} to quantize into {output}"))
    return QuantizationPlan(state, job_to_create, stale, model_override, condition, status, events)


def _condition(status: str, reason: str, message: str, now: str, generation: int | None) -> dict[str, Any]:
    return condition(CONDITION_TYPE, status, reason, message, generation=generation, now=now)
