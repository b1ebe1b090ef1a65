"""Never fail open: a ChatTTSDeployment whose NetworkPolicy the API server refuses has no pod
serving without it, and never says Ready=True.

The refusal is the real API server's: a ValidatingAdmissionPolicy (CEL, built in) that denies
NetworkPolicy writes in the test's namespace, as a cluster's own policy engine might. The
operator runs as a subprocess, as in its container.
"""
from __future__ import annotations

import json
import time

from tests.cluster.helpers import apply, get
from tests.support import ctd, wait_until

PEERS = [{"podSelector": {"matchLabels": {"app": "web"}}}]
DENIED = "NetworkPolicies are frozen in this namespace"


def condition(obj, ctype):
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def _freeze_network_policies(kubectl, namespace: str) -> str:
    """Deny NetworkPolicy writes in ``namespace``; returns the binding's name (deleting it lifts it)."""
    name = f"freeze-{namespace}"
    objects = [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{
                      "apiGroups": ["networking.k8s.io"], "apiVersions": ["v1"],
                      "operations": ["CREATE", "UPDATE"], "resources": ["networkpolicies"]}]},
                  "validations": [{"expression": "false", "message": DENIED}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {"policyName": name, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {
                      "matchLabels": {"kubernetes.io/metadata.name": namespace}}}}},
    ]
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    probe = json.dumps({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": "probe", "namespace": namespace},
                        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
    # The API server picks a new binding up within a moment: wait until it refuses.
    wait_until(lambda: DENIED in kubectl("create", "--dry-run=server", "-f", "-", input=probe, check=False).stderr,
               "the admission policy to refuse NetworkPolicies", timeout=30)
    return name


def _lift(kubectl, name: str) -> None:
    kubectl("delete", "validatingadmissionpolicybinding", name, "--ignore-not-found", check=False)
    kubectl("delete", "validatingadmissionpolicy", name, "--ignore-not-found", check=False)


def _serving_pods(kubectl, namespace: str, name: str) -> list[dict]:
    pods = json.loads(kubectl("get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}",
                              "-o", "json").stdout)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def test_a_refused_network_policy_serves_nothing_and_is_never_ready(crds, namespace, operators):
    kubectl = crds.kubectl
    operators(resync_interval_seconds="2").start()
    frozen = _freeze_network_policies(kubectl, namespace)
    try:
        apply(kubectl, namespace, ctd("fenced", replicas=1, networkPolicy={"allowFrom": PEERS}))
        obj = wait_until(lambda: (o := get(kubectl, namespace, "ctd", "fenced"))
                         and condition(o, "Protected").get("reason") == "ProtectionNotApplied" and o,
                         "Protected=False ProtectionNotApplied")
        ready = condition(obj, "Ready")
        assert ready["status"] == "False" and ready["reason"] == "ProtectionNotApplied", ready
        assert DENIED in ready["message"] and "scaled to 0" in ready["message"], ready
        assert condition(obj, "Degraded")["status"] == "True"
        assert obj["status"].get("appliedGeneration") is None
        # Over several resyncs (every 2 s): no serving pod, the Deployment at 0, never Ready.
        for _ in range(4):
            time.sleep(2)
            obj = get(kubectl, namespace, "ctd", "fenced")
            assert condition(obj, "Ready")["status"] == "False", obj["status"]
            assert not _serving_pods(kubectl, namespace, "fenced")
            deployments = json.loads(kubectl("get", "deploy", "-n", namespace, "-o", "json").stdout)["items"]
            assert all(d["spec"]["replicas"] == 0 for d in deployments), [d["spec"] for d in deployments]
        assert kubectl("get", "networkpolicy", "fenced", "-n", namespace, check=False).returncode != 0
    finally:
        _lift(kubectl, frozen)

    # The policy can be applied now: the fence first, then the pods, then Ready.
    obj = wait_until(lambda: (o := get(kubectl, namespace, "ctd", "fenced"))
                     and condition(o, "Ready").get("status") == "True" and o, "Ready once the fence is up")
    assert condition(obj, "Protected")["status"] == "True"
    assert kubectl("get", "networkpolicy", "fenced", "-n", namespace, check=False).returncode == 0
    assert get(kubectl, namespace, "deploy", "fenced")["spec"]["replicas"] == 1
    served = obj["status"]["appliedGeneration"]

    # Refused again on a change: the pods keep the policy applied before (the last protected
    # state) at the generation rolled out then; the new one is not rolled out, and not Ready.
    template = get(kubectl, namespace, "deploy", "fenced")["spec"]["template"]
    frozen = _freeze_network_policies(kubectl, namespace)
    try:
        kubectl("patch", "ctd", "fenced", "-n", namespace, "--type=merge", "-p", json.dumps(
            {"spec": {"networkPolicy": {"allowFrom": [{"podSelector": {"matchLabels": {"app": "api"}}}]},
                      "engine": {"maxNumSeqs": 32}}}))
        obj = wait_until(lambda: (o := get(kubectl, namespace, "ctd", "fenced"))
                         and condition(o, "Protected").get("status") == "False"
                         and o["status"].get("observedGeneration") == o["metadata"]["generation"] and o,
                         "the changed policy refused")
        ready = condition(obj, "Ready")
        assert ready["status"] == "False" and ready["reason"] == "ProtectionNotApplied"
        assert "keep the NetworkPolicy applied before" in ready["message"], ready
        assert obj["status"]["appliedGeneration"] == served
        time.sleep(4)  # two resyncs: the old pod template and the old fence stay
        live = get(kubectl, namespace, "deploy", "fenced")
        assert live["spec"]["template"] == template and live["spec"]["replicas"] == 1
        policy = get(kubectl, namespace, "networkpolicy", "fenced")
        assert policy["spec"]["ingress"][0]["from"] == PEERS
        assert condition(get(kubectl, namespace, "ctd", "fenced"), "Ready")["status"] == "False"
    finally:
        _lift(kubectl, frozen)
    wait_until(lambda: condition(get(kubectl, namespace, "ctd", "fenced"), "Ready").get("status") == "True"
               and get(kubectl, namespace, "networkpolicy", "fenced")["spec"]["ingress"][0]["from"][0]
               ["podSelector"]["matchLabels"] == {"app": "api"}, "the new fence, then Ready")


def test_a_blocked_spec_asking_for_a_refused_fence_stops_the_unfenced_pods(crds, namespace, operators):
    """Serving without a NetworkPolicy, then a spec that asks for one and cannot start (no GPU
    that large): nothing of the new generation is rolled out, and the pods of the old one, which
    have no fence, stop serving while the fence is refused."""
    kubectl = crds.kubectl
    operators(resync_interval_seconds="2").start()
    apply(kubectl, namespace, ctd("open", replicas=1))
    wait_until(lambda: condition(get(kubectl, namespace, "ctd", "open"), "Ready").get("status") == "True",
               "serving without a fence")
    frozen = _freeze_network_policies(kubectl, namespace)
    try:
        kubectl("patch", "ctd", "open", "-n", namespace, "--type=merge", "-p", json.dumps(
            {"spec": {"networkPolicy": {"allowFrom": PEERS}, "gpu": {"memory": "4000Gi"}}}))
        obj = wait_until(lambda: (o := get(kubectl, namespace, "ctd", "open"))
                         and condition(o, "Protected").get("reason") == "ProtectionNotApplied" and o,
                         "Protected=False on the blocked spec")
        assert condition(obj, "Ready")["status"] == "False"
        assert condition(obj, "GPUCapacity")["status"] == "False"
        wait_until(lambda: get(kubectl, namespace, "deploy", "open")["spec"]["replicas"] == 0
                   and not _serving_pods(kubectl, namespace, "open"), "the unfenced pods gone")
    finally:
        _lift(kubectl, frozen)
