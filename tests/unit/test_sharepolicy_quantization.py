"""AWQ quantization as an offline Job: the Job builder and the serve-what-decision."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from chattts_operator.api.quantization import QuantizationSpec
from chattts_operator.quantization.plan import (
    JobPlacement,
    job_name,
    job_state,
    plan_quantization,
    resolve_source,
    spec_hash,
)
from chattts_operator.api.sharepolicy import OFFLINE_PRIORITY_ANNOTATION, OFFLINE_PRIORITY_CLASS, SHARE_POLICY_LABEL

QUANT = {
    "calibration": {"configMap": {"name": "calib", "key": "texts.jsonl"}},
    "output": {"claimName": "weights-rw", "subPath": "awq"},
    "sharePolicy": "gpu-pool",
    "priority": 7,
}
MODEL = {"pvc": {"claimName": "weights", "subPath": "chattts-fp16"}, "format": "fp16", "servedName": "chattts"}
SPEC = {"replicas": 2, "model": MODEL, "gpu": {"memory": "8Gi"}, "quantization": QUANT}
LIMITS = {"nvidia.com/gpu.memory": "8192"}


def plan(spec=SPEC, jobs=(), previous=None):
    return plan_quantization(
        ctd_name="tts", namespace="ns", owner_uid="uid-1", spec=spec, jobs=list(jobs), previous=previous,
        placement=JobPlacement(image="chattts-runtime:0.1.0", gpu_limits=LIMITS), now="2026-11-30T00:00:00Z",
        generation=3,
    )


def finished(job, kind):
    job = {**job, "status": {"conditions": [{"type": kind, "status": "True", "reason": "BackoffLimitExceeded" if kind == "Failed" else "", "message": "pod failed" if kind == "Failed" else ""}]}}
    return job


def test_first_pass_creates_a_suspended_offline_job_and_keeps_fp16():
    p = plan()
    job = p.job_to_create
    assert p.state == "Pending" and p.model_override is None
    assert job["metadata"]["name"].startswith("tts-awq-")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][SHARE_POLICY_LABEL] == "gpu-pool"
    assert job["metadata"]["annotations"][OFFLINE_PRIORITY_ANNOTATION] == "7"
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == OFFLINE_PRIORITY_CLASS
    assert pod["containers"][0]["resources"]["limits"] == LIMITS
    args = pod["containers"][0]["args"]
    digest = job["metadata"]["labels"]["tts.chattts.io/quantization-hash"]
    assert args[:3] == ["quantize", "--model", "/models/source"]
    assert args[args.index("--out") + 1] == f"/output/{digest}"
    assert args[args.index("--calib") + 1] == "/calibration/texts.jsonl"
    assert args[args.index("--w-bit") + 1] == "4" and args[args.index("--group-size") + 1] == "128"
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["source"]["readOnly"] is True and mounts["source"]["subPath"] == "chattts-fp16"
    assert mounts["output"].get("readOnly") is not True and mounts["output"]["subPath"] == "awq"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["source"]["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert p.condition["type"] == "Quantized" and p.condition["status"] == "False"
    assert ("Normal", "QuantizationStarted") == p.events[0][:2]


def test_the_builder_is_deterministic():
    assert plan().job_to_create == plan().job_to_create


def test_without_a_share_policy_the_job_starts_at_once():
    spec = {**SPEC, "quantization": {k: v for k, v in QUANT.items() if k not in ("sharePolicy", "priority")}}
    job = plan(spec).job_to_create
    assert job["spec"]["suspend"] is False
    assert SHARE_POLICY_LABEL not in job["metadata"]["labels"]


def test_running_then_succeeded_switches_to_read_only_awq():
    created = plan().job_to_create
    running = {**created, "spec": {**created["spec"], "suspend": False}, "status": {"active": 1}}
    p = plan(jobs=[running])
    assert p.state == "Running" and p.job_to_create is None and p.model_override is None
    done = finished(running, "Complete")
    p = plan(jobs=[done], previous=p.status)
    digest = created["metadata"]["labels"]["tts.chattts.io/quantization-hash"]
    assert p.state == "Succeeded"
    assert p.model_override == {"pvc": {"claimName": "weights-rw", "subPath": f"awq/{digest}"}, "format": "awq", "servedName": "chattts"}
    assert p.condition["status"] == "True" and p.condition["observedGeneration"] == 3
    assert [e[1] for e in p.events] == ["Quantized"]
    # The Job may be cleaned up later: the pods stay on the quantized weights.
    p2 = plan(jobs=[], previous=p.status)
    assert p2.state == "Succeeded" and p2.job_to_create is None and p2.model_override == p.model_override
    assert p2.events == []


def test_failure_keeps_the_current_weights_and_says_why():
    created = plan().job_to_create
    p = plan(jobs=[finished(created, "Failed")], previous=plan().status)
    assert p.state == "Failed" and p.model_override is None
    assert p.condition["reason"] == "JobFailed"
    assert "BackoffLimitExceeded" in p.condition["message"] and "keep spec.model" in p.condition["message"]
    assert p.events[0][:2] == ("Warning", "QuantizationFailed")


def test_a_new_spec_runs_a_new_job_while_the_old_quantized_weights_keep_serving():
    created = plan().job_to_create
    served = plan(jobs=[finished(created, "Complete")], previous=plan().status)
    new_spec = {**SPEC, "quantization": {**QUANT, "groupSize": 64}}
    p = plan(new_spec, jobs=[finished(created, "Complete")], previous=served.status)
    assert p.job_to_create is not None and p.job_to_create["metadata"]["name"] != created["metadata"]["name"]
    assert p.stale_jobs == [created["metadata"]["name"]]
    assert p.model_override == served.model_override  # the old AWQ weights, not fp16
    new_job = p.job_to_create
    failed = plan(new_spec, jobs=[finished(new_job, "Failed")], previous=p.status)
    assert failed.model_override == served.model_override
    assert "keep the AWQ weights" in failed.condition["message"]


def test_hash_ignores_scheduling_knobs_but_not_outputs():
    q = QuantizationSpec.model_validate(QUANT)
    source = resolve_source(q, MODEL)
    assert spec_hash(q, source) == spec_hash(QuantizationSpec.model_validate({**QUANT, "priority": 1}), source)
    assert spec_hash(q, source) != spec_hash(QuantizationSpec.model_validate({**QUANT, "nSamples": 8}), source)


def test_job_states():
    assert job_state({"spec": {"suspend": True}}) == ("Suspended", "waiting for its GPUSharePolicy to admit it")
    assert job_state({"spec": {}, "status": {"active": 1}})[0] == "Running"
    assert job_state({"spec": {}})[0] == "Pending"


def test_quantizing_non_fp16_weights_without_a_source_is_explained():
    spec = {**SPEC, "model": {**MODEL, "format": "awq"}}
    p = plan(spec)
    assert p.state == "Invalid" and p.job_to_create is None
    assert "needs fp16" in p.condition["message"]
    spec = {**SPEC, "model": {"hostPath": {"path": "/w"}, "format": "fp16"}}
    assert "quantization.source is required" in plan(spec).condition["message"]


def test_not_requested_deletes_leftover_jobs():
    p = plan({**SPEC, "quantization": None}, jobs=[{"metadata": {"name": "tts-awq-old"}}])
    assert p.state == "NotRequested" and p.stale_jobs == ["tts-awq-old"] and p.condition is None


@pytest.mark.parametrize(
    "bad, message",
    [
        ({**QUANT, "wBit": 8}, "wBit"),
        ({**QUANT, "groupSize": 100}, "groupSize"),
        ({**QUANT, "calibration": {}}, "exactly one of pvc or configMap"),
        ({**QUANT, "output": {"claimName": "x", "subPath": "../etc"}}, "may not contain"),
        ({**QUANT, "output": {"claimName": "x", "subPath": "/abs"}}, "pattern"),
        ({**QUANT, "nSamples": 0}, "nSamples"),
    ],
)
def test_bad_quantization_specs(bad, message):
    with pytest.raises(ValidationError, match=message):
        QuantizationSpec.model_validate(bad)


def test_job_name_fits_pod_names():
    assert len(job_name("a" * 45, "0123456789")) <= 63
