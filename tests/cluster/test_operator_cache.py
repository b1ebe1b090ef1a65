"""The watch-fed read cache of children and pods (core/watch.py ChildCache), against the real
API server: a steady-state resync pass reads nothing, and a hand edit of any child is put back
by that child's own watch event, long before the next resync."""
from __future__ import annotations

import json
import time

from tests.cluster.helpers import apply, get, runtime_configmap, runtime_yaml
from tests.cluster.test_operator_lifecycle import condition, ready
from tests.support import ctd, wait_until

REQUESTS = "chattts_operator_api_requests_total"


def requests_by_kind(op) -> dict[tuple[str, str], float]:
    return {(dict(labels)["method"], dict(labels)["resource"]): value
            for (name, labels), value in op.metrics().items() if name == REQUESTS}


def settled(kubectl, namespace: str, name: str) -> bool:
    obj = ready(kubectl, namespace, name)
    return bool(obj) and condition(obj, "Progressing").get("status") == "False"


def test_a_steady_state_resync_pass_makes_no_read_of_any_child(crds, namespace, operators):
    kubectl = crds.kubectl
    op = operators(resync_interval_seconds="1").start()
    apply(kubectl, namespace, ctd("tts-a"), ctd("tts-b", networkPolicy={"allowFrom": []}))
    for name in ("tts-a", "tts-b"):
        wait_until(lambda: settled(kubectl, namespace, name), f"{name} settled", timeout=120)
    time.sleep(3)  # the last pods' events and their reconciles
    before = requests_by_kind(op)
    passes = op.metric_sum("chattts_operator_reconciles_total", trigger="resync")
    wait_until(lambda: op.metric_sum("chattts_operator_reconciles_total", trigger="resync") >= passes + 6,
               "three resync passes over both objects", timeout=60)
    after = requests_by_kind(op)
    made = {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)}
    # Only the node list behind the largest-GPU check may run (at most once a pass, not per object).
    assert set(made) <= {("GET", "nodes")}, made
    assert op.metric_sum("chattts_operator_reconciles_total", trigger="resync", result="noop") >= passes + 6
    # Before any pass the cache was filled by one list per kind, not a read per object.
    assert before.get(("GET", "configmaps"), 0) <= 2 and before.get(("GET", "services"), 0) <= 2
    assert op.metric_sum("chattts_operator_cached_objects") >= 2 * 4 + 4  # children + 2 pods each


def test_hand_edits_of_every_child_are_put_back_by_its_watch(crds, namespace, operators):
    kubectl = crds.kubectl
    operators(resync_interval_seconds="600").start()  # no resync pass during the test
    apply(kubectl, namespace, ctd("tts", networkPolicy={"allowFrom": []}))
    wait_until(lambda: settled(kubectl, namespace, "tts"), "tts settled", timeout=120)

    kubectl("patch", "service", "tts", "-n", namespace, "--type=merge", "-p",
            json.dumps({"spec": {"selector": {"app.kubernetes.io/instance": "someone-else"}}}))
    configmap = runtime_configmap(kubectl, namespace, "tts")["metadata"]["name"]
    # The runtime ConfigMap is immutable (its name carries its content's hash): the API server
    # refuses an edit of its data; deleted, it comes back under the same name.
    refused = kubectl("patch", "configmap", configmap, "-n", namespace, "--type=merge", "-p",
                      '{"data":{"runtime.yaml":"engine: {}\\n"}}', check=False)
    assert refused.returncode != 0 and "immutable" in refused.stderr, refused.stderr
    kubectl("delete", "configmap", configmap, "-n", namespace)
    kubectl("delete", "poddisruptionbudget", "tts", "-n", namespace)
    kubectl("patch", "networkpolicy", "tts", "-n", namespace, "--type=merge", "-p",
            json.dumps({"spec": {"policyTypes": ["Ingress", "Egress"]}}))
    started = time.monotonic()
    wait_until(lambda: get(kubectl, namespace, "service", "tts")["spec"]["selector"]
               ["app.kubernetes.io/instance"] == "tts", "Service selector put back", timeout=20)
    wait_until(lambda: "max_num_seqs" in get(kubectl, namespace, "configmap", configmap)["data"]["runtime.yaml"],
               "ConfigMap recreated", timeout=20)
    wait_until(lambda: get(kubectl, namespace, "poddisruptionbudget", "tts"), "PDB recreated", timeout=20)
    wait_until(lambda: get(kubectl, namespace, "networkpolicy", "tts")["spec"]["policyTypes"] == ["Ingress"],
               "NetworkPolicy put back", timeout=20)
    print(f"every child put back {time.monotonic() - started:.1f}s after the edits")


def test_a_restarted_operator_fills_its_cache_by_lists_and_writes_nothing(crds, namespace, operators):
    kubectl = crds.kubectl
    first = operators().start()
    apply(kubectl, namespace, ctd("tts-a"), ctd("tts-b"))
    for name in ("tts-a", "tts-b"):
        wait_until(lambda: settled(kubectl, namespace, name), f"{name} settled", timeout=120)
    first.stop()
    second = operators().start()
    wait_until(lambda: second.metric_sum("chattts_operator_reconciles_total", trigger="resume") >= 2,
               "both objects resumed", timeout=60)
    time.sleep(2)
    made = requests_by_kind(second)
    # Listed children must compare equal to the manifests (a list's items lack apiVersion and kind).
    assert second.metric_sum("chattts_operator_child_writes_total") == 0
    assert second.metric_sum("chattts_operator_status_writes_total") == 0
    assert {resource for (method, resource) in made if method != "GET"} <= {"priorityclasses"}, made
    for resource in ("configmaps", "services", "deployments", "poddisruptionbudgets", "pods"):
        assert made.get(("GET", resource), 0) <= 1, made  # the cache's list, no read per object


def test_a_new_object_costs_its_child_applies_and_status_and_no_kopf_annotation(crds, namespace, operators):
    """Level-based handling (kopf's stateless event handler, no create/update handlers): kopf
    never patches its diff-base annotation onto the object, so a new object costs its four
    child applies and its status, and a spec change its ConfigMap, its Deployment and status."""
    kubectl = crds.kubectl
    op = operators().start()
    apply(kubectl, namespace, ctd("tts"))
    wait_until(lambda: settled(kubectl, namespace, "tts"), "tts settled", timeout=120)
    time.sleep(2)  # the last pod events and their reconciles
    obj = get(kubectl, namespace, "ctd", "tts")
    assert not [k for k in obj["metadata"].get("annotations") or {} if k.startswith("chattts.io/")], obj["metadata"]
    assert op.metric_sum("chattts_operator_child_writes_total") == 4
    status_writes = op.metric_sum("chattts_operator_status_writes_total")
    assert 1 <= status_writes <= 2, status_writes  # Progressing, then Ready (one when Ready came first)
    made = requests_by_kind(op)
    assert not [key for key in made if key[1] == "chattsdeployments"], made  # only the status subresource

    kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"engine":{"maxNumSeqs":7}}}')
    wait_until(lambda: "max_num_seqs: 7" in runtime_yaml(kubectl, namespace, "tts"), "the change applied", timeout=30)
    wait_until(lambda: settled(kubectl, namespace, "tts"), "tts settled again", timeout=120)
    obj = get(kubectl, namespace, "ctd", "tts")
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 2
    assert not [k for k in obj["metadata"].get("annotations") or {} if k.startswith("chattts.io/")]
    assert op.metric_sum("chattts_operator_child_writes_total") == 4 + 2  # the ConfigMap and the Deployment
