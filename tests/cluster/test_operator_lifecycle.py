"""The operator against the real local control plane (kube-apiserver, controller-manager,
scheduler, kwok GPU nodes). The operator runs as a subprocess (`python -m chattts_operator
run`), exactly as its container does, so it can also be killed with SIGKILL mid-way."""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.helpers import INSTANCE, MANAGED, apply, expected_configmap_name, get, runtime_configmap, runtime_yaml
from tests.support import ctd, wait_until

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
CHILD_KINDS = ("deployment", "configmap", "service", "poddisruptionbudget")


@pytest.fixture
def operator(operators):
    return operators().start()


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def ready(kubectl, namespace: str, name: str, generation: int | None = None) -> dict[str, Any] | None:
    obj = get(kubectl, namespace, "ctd", name)
    st = obj.get("status") or {}
    gen = generation or obj["metadata"]["generation"]
    if (st.get("phase") == "Ready" and st.get("observedGeneration") == gen and st.get("appliedGeneration") == gen
            and st.get("readyReplicas") == obj["spec"]["replicas"]):
        return obj
    return None


def pods_of(kubectl, namespace: str, name: str) -> list[dict[str, Any]]:
    return get(kubectl, namespace, "pods", "-l", f"{INSTANCE}={name}")["items"]


def running_pods(kubectl, namespace: str, name: str, count: int) -> list[dict[str, Any]] | None:
    pods = [p for p in pods_of(kubectl, namespace, name) if not p["metadata"].get("deletionTimestamp")]
    if len(pods) == count and all(p["status"].get("phase") == "Running" and p["spec"].get("nodeName") for p in pods):
        return pods
    return None


# --- examples: pods on simulated GPU nodes, exact limits, read-only mounts ---------------------

EXPECTED_EXAMPLES = {
    # name: (limits on the runtime container, node predicate)
    "chattts-awq": ({"memory": "8Gi", "nvidia.com/gpu.memory": "8192"}, lambda n: True),
    "chattts-hami": ({"memory": "8Gi", "nvidia.com/gpu": "1", "nvidia.com/gpumem": "16384"}, lambda n: True),
    "chattts-mig": ({"memory": "8Gi", "nvidia.com/mig-1g.18gb": "1"},
                    lambda n: n["metadata"]["labels"].get("nvidia.com/mig.strategy") == "mixed"),
    "chattts-tp2": ({"memory": "8Gi", "nvidia.com/gpu": "2"},
                    lambda n: n["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"),
}


def test_examples_run_on_gpu_nodes_with_exact_limits_and_read_only_weights(crds, namespace, operator):
    kubectl = crds.kubectl
    kubectl("delete", "pv", "chattts-weights-awq", "--ignore-not-found", "--wait=true")
    kubectl("apply", "-f", str(EXAMPLES / "local" / "weights-pv.yaml"))
    try:
        for example in sorted(EXAMPLES.glob("chattts-*.yaml")):
            kubectl("apply", "-n", namespace, "-f", str(example))
        nodes = {n["metadata"]["name"]: n for n in json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]}
        for name, (limits, node_ok) in EXPECTED_EXAMPLES.items():
            obj = wait_until(lambda: ready(kubectl, namespace, name), f"{name} Ready", timeout=180)
            pods = wait_until(lambda: running_pods(kubectl, namespace, name, obj["spec"]["replicas"]),
                              f"{name} pods Running")
            memory_mib = int(obj["status"]["gpu"]["nodeMinGpuMemoryMiB"])
            for pod in pods:
                node = nodes[pod["spec"]["nodeName"]]
                assert int(node["metadata"]["labels"]["nvidia.com/gpu.memory"]) >= memory_mib
                assert node_ok(node), f"{name} landed on {node['metadata']['name']}"
                container = pod["spec"]["containers"][0]
                assert container["resources"]["limits"] == limits
                mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
                assert mounts["/models/chattts"]["readOnly"] is True
                assert mounts["/etc/chattts"]["readOnly"] is True
                writable = {p for p, m in mounts.items() if not m.get("readOnly")}
                assert writable <= {"/tmp", "/dev/shm"}
                sc = container["securityContext"]
                assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and sc["capabilities"] == {"drop": ["ALL"]}
                volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
                if "persistentVolumeClaim" in volumes["model"]:
                    assert volumes["model"]["persistentVolumeClaim"]["readOnly"] is True
            assert obj["status"]["gpuShare"] and condition(obj, "GPUCapacity")["status"] == "True"
        printed = kubectl("get", "ctd", "-n", namespace).stdout
        assert "1x8Gi gpu-memory" in printed and "2x40Gi whole-gpu" in printed and "Ready" in printed
    finally:
        kubectl("delete", "-n", namespace, "ctd", "--all", "--wait=false", check=False)
        kubectl("delete", "-n", namespace, "pvc", "--all", "--wait=false", check=False)
        kubectl("delete", "pv", "chattts-weights-awq", "--ignore-not-found", "--wait=false", check=False)


# --- updates ----------------------------------------------------------------------------------


def test_update_rolls_out_and_an_update_that_cannot_start_keeps_serving(crds, namespace, operator):
    kubectl = crds.kubectl
    apply(kubectl, namespace, ctd("tts"))
    wait_until(lambda: ready(kubectl, namespace, "tts"), "tts Ready")
    # With the default 300 s resync, only the Deployment watch can put these back this fast.
    kubectl("patch", "deploy", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":5}}')
    wait_until(lambda: get(kubectl, namespace, "deploy", "tts")["spec"]["replicas"] == 2,
               "hand-edited replicas reverted by the watch", timeout=20)
    uid = get(kubectl, namespace, "deploy", "tts")["metadata"]["uid"]
    kubectl("delete", "deploy", "tts", "-n", namespace, "--wait=false")
    wait_until(lambda: get(kubectl, namespace, "deploy", "tts")["metadata"]["uid"] != uid,
               "deleted Deployment recreated by the watch", timeout=20)
    wait_until(lambda: ready(kubectl, namespace, "tts"), "tts Ready again")
    old_pods = {p["metadata"]["name"] for p in wait_until(lambda: running_pods(kubectl, namespace, "tts", 2), "pods")}
    old_hash = get(kubectl, namespace, "deploy", "tts")["spec"]["template"]["metadata"]["annotations"][
        "chattts.io/config-hash"]

    # A config change rolls every pod.
    kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"engine":{"maxNumSeqs":32}}}')
    wait_until(lambda: ready(kubectl, namespace, "tts", generation=2), "generation 2 rolled out", timeout=180)
    new_pods = wait_until(lambda: running_pods(kubectl, namespace, "tts", 2), "new pods")
    assert not old_pods & {p["metadata"]["name"] for p in new_pods}
    dep = get(kubectl, namespace, "deploy", "tts")
    assert dep["spec"]["template"]["metadata"]["annotations"]["chattts.io/config-hash"] != old_hash
    assert "max_num_seqs: 32" in runtime_yaml(kubectl, namespace, "tts")

    # An update that cannot start (weights do not fit in 1 GiB) is reported and not rolled out.
    serving_pods = {p["metadata"]["name"] for p in new_pods}
    kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"gpu":{"memory":"1Gi"}}}')

    def blocked():
        obj = get(kubectl, namespace, "ctd", "tts")
        return obj if obj["status"].get("observedGeneration") == 3 and \
            condition(obj, "GPUCapacity").get("status") == "False" else None
    obj = wait_until(blocked, "GPUCapacity=False")
    cap = condition(obj, "GPUCapacity")
    assert cap["reason"] == "WeightsDoNotFit" and "MiB" in cap["message"]
    assert condition(obj, "Degraded")["status"] == "True"
    assert condition(obj, "Ready")["status"] == "True"
    assert obj["status"]["appliedGeneration"] == 2 and obj["status"]["phase"] == "Degraded"
    time.sleep(3)  # give a wrong rollout the chance to show
    dep_after = get(kubectl, namespace, "deploy", "tts")
    assert dep_after["metadata"]["generation"] == dep["metadata"]["generation"]
    assert dep_after["spec"]["template"] == dep["spec"]["template"]
    assert {p["metadata"]["name"] for p in running_pods(kubectl, namespace, "tts", 2)} == serving_pods
    events = get(kubectl, namespace, "events", "--field-selector", "involvedObject.name=tts")["items"]
    assert any(e["reason"] == "GPUCapacityFalse" and e["type"] == "Warning" for e in events)

    # Fixing the spec clears the conditions and rolls out again.
    kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"gpu":{"memory":"10Gi"}}}')
    obj = wait_until(lambda: ready(kubectl, namespace, "tts", generation=4), "generation 4 rolled out", timeout=180)
    assert condition(obj, "Degraded")["status"] == "False"
    assert get(kubectl, namespace, "deploy", "tts")["spec"]["template"]["spec"]["containers"][0]["resources"][
        "limits"]["nvidia.com/gpu.memory"] == "10240"


# --- steady state: zero writes, hand edits reverted, scale subresource ---------------------------


def snapshot(kubectl, namespace: str, name: str) -> dict[str, str]:
    out = {"ctd": get(kubectl, namespace, "ctd", name)["metadata"]["resourceVersion"]}
    configmap = runtime_configmap(kubectl, namespace, name)["metadata"]["name"]
    for kind, child in (("deployment", name), ("configmap", configmap), ("service", name),
                        ("poddisruptionbudget", name)):
        out[kind] = get(kubectl, namespace, kind, child)["metadata"]["resourceVersion"]
    return out


def test_noop_resync_writes_nothing_hand_edits_are_reverted_and_scale_works(crds, namespace, operators):
    kubectl = crds.kubectl
    op = operators(resync_interval_seconds="1").start()
    apply(kubectl, namespace, ctd("tts"))
    wait_until(lambda: ready(kubectl, namespace, "tts"), "tts Ready")

    # kubectl scale goes through the scale subresource.
    kubectl("scale", "ctd/tts", "-n", namespace, "--replicas=3")
    wait_until(lambda: ready(kubectl, namespace, "tts") and get(kubectl, namespace, "deploy", "tts")["spec"][
        "replicas"] == 3, "3 replicas")
    scale = json.loads(kubectl("get", "--raw",
                               f"/apis/tts.chattts.io/v1alpha1/namespaces/{namespace}/chattsdeployments/tts/scale").stdout)
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert "app.kubernetes.io/instance=tts" in scale["status"]["selector"]
    wait_until(lambda: condition(get(kubectl, namespace, "ctd", "tts"), "Progressing").get("status") == "False",
               "rollout settled")
    time.sleep(2)

    before = snapshot(kubectl, namespace, "tts")
    writes_before = op.metric_sum("chattts_operator_child_writes_total")
    status_before = op.metric_sum("chattts_operator_status_writes_total")
    resyncs_before = op.metric_sum("chattts_operator_reconciles_total", trigger="resync")
    wait_until(lambda: op.metric_sum("chattts_operator_reconciles_total", trigger="resync") >= resyncs_before + 3,
               "three resync passes", timeout=60)
    assert snapshot(kubectl, namespace, "tts") == before
    assert op.metric_sum("chattts_operator_child_writes_total") == writes_before
    assert op.metric_sum("chattts_operator_status_writes_total") == status_before
    assert op.metric_sum("chattts_operator_reconciles_total", trigger="resync", result="noop") >= 3
    assert op.metric_sum("chattts_operator_managed_objects") == 1

    # Hand edits of what the operator owns are put back.
    kubectl("patch", "deploy", "tts", "-n", namespace, "--type=merge", "-p",
            '{"spec":{"replicas":7,"template":{"spec":{"containers":[{"name":"runtime","image":"evil:1"}]}}}}')
    wait_until(lambda: (lambda d: d["spec"]["replicas"] == 3 and
                        d["spec"]["template"]["spec"]["containers"][0]["image"] == "chattts-runtime:test")(
        get(kubectl, namespace, "deploy", "tts")), "Deployment edit reverted", timeout=30)
    configmap = runtime_configmap(kubectl, namespace, "tts")["metadata"]["name"]
    kubectl("delete", "configmap", configmap, "-n", namespace)
    wait_until(lambda: "max_num_seqs" in get(kubectl, namespace, "configmap", configmap)["data"]["runtime.yaml"],
               "ConfigMap recreated", timeout=30)
    kubectl("delete", "service", "tts", "-n", namespace)
    wait_until(lambda: get(kubectl, namespace, "service", "tts"), "Service recreated", timeout=30)


# --- deletion and restarts ---------------------------------------------------------------------


def children(kubectl, namespace: str) -> dict[str, dict[str, str]]:
    """kind -> {name: uid} of everything the operator manages in the namespace."""
    out = {}
    for kind in CHILD_KINDS:
        items = get(kubectl, namespace, kind, "-l", MANAGED)["items"]
        out[kind] = {i["metadata"]["name"]: i["metadata"]["uid"] for i in items}
    return out


def test_delete_collects_everything(crds, namespace, operator):
    kubectl = crds.kubectl
    apply(kubectl, namespace, ctd("tts"))
    obj = wait_until(lambda: ready(kubectl, namespace, "tts"), "tts Ready")
    assert not obj["metadata"].get("finalizers"), "no finalizer: owner references collect the children"
    assert all(k.startswith("chattts.io/") for k in obj["metadata"].get("annotations", {})
               if "kopf" in k or "last-handled" in k)
    assert all(children(kubectl, namespace)[k] for k in CHILD_KINDS)
    kubectl("delete", "ctd", "tts", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_until(lambda: not any(children(kubectl, namespace).values()) and not pods_of(kubectl, namespace, "tts"),
               "children garbage-collected", timeout=120)


def test_killed_operator_restarts_without_duplicate_or_lost_children(crds, namespace, operators):
    kubectl = crds.kubectl
    names = [f"tts-{i}" for i in range(6)]
    first = operators().start()
    apply(kubectl, namespace, *[ctd(n, replicas=1) for n in names])
    # Kill it mid-way: once some, but typically not all, children exist.
    wait_until(lambda: children(kubectl, namespace)["deployment"], "the first Deployment", timeout=60, interval=0.1)
    first.stop(signal.SIGKILL)
    seen = children(kubectl, namespace)

    operators().start()
    objs = {name: wait_until(lambda: ready(kubectl, namespace, name), f"{name} Ready", timeout=180) for name in names}
    final = children(kubectl, namespace)
    for kind in CHILD_KINDS:
        expected = {expected_configmap_name(objs[n]) if kind == "configmap" else n for n in names}
        assert set(final[kind]) == expected, kind
        # Children made before the kill were kept, not recreated.
        for name, uid in seen[kind].items():
            assert final[kind][name] == uid, f"{kind} {name} was recreated"
    # One ReplicaSet per Deployment: nothing rolled twice.
    replicasets = get(kubectl, namespace, "replicasets")["items"]
    assert sorted(rs["metadata"]["labels"][INSTANCE] for rs in replicasets) == sorted(names)
