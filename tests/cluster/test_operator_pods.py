"""Pod-level truth in status, with the real scheduler: what keeps the serving pods from running
(a missing PVC, a taint no pod tolerates, a quota) reaches the ChatTTSDeployment's conditions
and phase within seconds, in the scheduler's (or the API server's) own words."""
from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.cluster.helpers import apply, get
from tests.support import ctd, wait_until


@pytest.fixture
def operator(operators):
    return operators().start()


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def status_says(kubectl, namespace: str, name: str, phase: str, words: str) -> dict[str, Any] | None:
    obj = get(kubectl, namespace, "ctd", name)
    if (obj.get("status") or {}).get("phase") == phase and words in conditions(obj).get("Ready", {}).get("message", ""):
        return obj
    return None


def test_a_missing_pvc_is_named_in_status_and_phase(crds, namespace, operator):
    kubectl = crds.kubectl
    apply(kubectl, namespace, ctd("tts-nopvc", replicas=1, model={"pvc": {"claimName": "weights-missing"},
                                                                   "format": "fp16"}))
    started = time.monotonic()
    obj = wait_until(lambda: status_says(kubectl, namespace, "tts-nopvc", "Unschedulable",
                                         'persistentvolumeclaim "weights-missing" not found'),
                     "the scheduler's reason in the ChatTTSDeployment's status", timeout=90)
    print(f"reason in status {time.monotonic() - started:.1f}s after the apply")
    c = conditions(obj)
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "PodsUnschedulable"
    assert c["Progressing"]["reason"] == "PodsUnschedulable" and "weights-missing" in c["Progressing"]["message"]
    assert c["Degraded"]["status"] == "True"
    pod = get(kubectl, namespace, "pods", "-l", "app.kubernetes.io/instance=tts-nopvc")["items"][0]
    assert f"pod {pod['metadata']['name']}: Pending: 0/" in c["Ready"]["message"]
    # kubectl get ctd shows it in the Phase column.
    table = kubectl("get", "ctd", "tts-nopvc", "-n", namespace).stdout
    assert "Unschedulable" in table


def test_a_taint_no_pod_tolerates_is_named_in_status(crds, namespace, operator):
    kubectl = crds.kubectl
    template = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"][0]
    node_name = f"tainted-{namespace}"[:63]
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node_name, "annotations": template["metadata"].get("annotations") or {},
                         "labels": {**template["metadata"]["labels"], "kubernetes.io/hostname": node_name,
                                    "chattts.io/test-pool": namespace}},
            "spec": {"taints": [{"key": "chattts.io/reserved", "value": "batch", "effect": "NoSchedule"}]},
            "status": {k: template["status"][k] for k in ("capacity", "allocatable")}}
    kubectl("create", "-f", "-", input=json.dumps(node))
    try:
        apply(kubectl, namespace, ctd("tts-taint", replicas=1,
                                      gpu={"memory": "8Gi", "nodeSelector": {"chattts.io/test-pool": namespace}}))
        obj = wait_until(lambda: status_says(kubectl, namespace, "tts-taint", "Unschedulable",
                                             "1 node(s) had untolerated taint"),
                         "the untolerated taint in status", timeout=90)
        assert conditions(obj)["Degraded"]["reason"] == "PodsUnschedulable"
    finally:
        kubectl("delete", "node", node_name, "--ignore-not-found", "--wait=false")


def test_a_quota_that_refuses_the_pods_is_named_in_status(crds, namespace, operator):
    kubectl = crds.kubectl
    apply(kubectl, namespace, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-pods"},
                               "spec": {"hard": {"pods": "0"}}})
    apply(kubectl, namespace, ctd("tts-quota", replicas=1))

    def refused():
        obj = get(kubectl, namespace, "ctd", "tts-quota")
        degraded = conditions(obj).get("Degraded", {})
        return obj if degraded.get("status") == "True" and "exceeded quota" in degraded.get("message", "") else None

    obj = wait_until(refused, "the quota's refusal in status", timeout=90)
    assert conditions(obj)["Degraded"]["reason"] == "ReplicaFailure" and obj["status"]["phase"] == "Degraded"
