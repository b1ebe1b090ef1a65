"""The local control plane is a real cluster: scheduler, controllers, kwok nodes, helm.

Everything except the nodes-file checks runs against real processes started by
hack/cluster/localcluster.py (the session ``cluster`` fixture, and a second
private cluster for the start/stop test).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpunodes
import localcluster
from tests.support import wait_until

TESTDATA = Path(__file__).parent / "testdata"
CLI = Path(localcluster.__file__)


def pod_manifest(name: str, limits: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/app:1",
                                     "resources": {"limits": limits}}], **extra}}


def apply(kubectl, namespace: str, manifest: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def get_json(kubectl, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def condition(obj: dict[str, Any], kind: str) -> str | None:
    for c in obj.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return c["status"]
    return None


# ---------------------------------------------------------------------------
# The nodes file (pure)


def test_nodes_file_declares_gpu_flavours_and_sharing_resources():
    nodes = {m["metadata"]["name"]: m for m in gpunodes.node_manifests(gpunodes.load_nodes())}
    products = {m["metadata"]["labels"]["nvidia.com/gpu.product"] for m in nodes.values()}
    assert {"NVIDIA-H200", "NVIDIA-A100-SXM4-80GB"} <= products
    h200 = nodes["gpu-h200-0"]
    assert h200["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    assert h200["metadata"]["labels"]["nvidia.com/gpu.memory"] == "143771"
    assert h200["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    capacity = h200["status"]["capacity"]
    assert capacity["nvidia.com/gpu"] == "8"
    assert capacity["nvidia.com/gpu.memory"] == str(8 * 143771)
    assert capacity["nvidia.com/gpumem"] == str(8 * 143771)
    assert capacity["nvidia.com/gpucores"] == "800"
    assert h200["status"]["allocatable"] == capacity
    mig = nodes["gpu-h200-mig-0"]["status"]["capacity"]
    assert mig["nvidia.com/mig-1g.18gb"] == "16" and mig["nvidia.com/mig-3g.71gb"] == "8"
    assert "nvidia.com/gpu" not in mig


@pytest.mark.parametrize("document, message", [
    ({"flavours": {}, "nodes": [{"name": "n0", "flavour": "h100"}]}, "unknown flavour 'h100'"),
    ({"flavours": {"f": {"product": "P", "family": "hopper", "computeMajor": 9, "computeMinor": 0,
                         "gpus": 0, "gpuMemoryMiB": 1, "cpu": "1", "memory": "1Gi", "pods": 1}},
      "nodes": []}, "flavour 'f'.gpus: expected a positive whole number"),
    ({"flavours": {"f": {"product": "P", "family": "hopper", "computeMajor": 9, "computeMinor": 0,
                         "gpus": 1, "gpuMemoryMiB": 1000, "cpu": "1", "memory": "1Gi", "pods": 1,
                         "mig": {"strategy": "mixed", "perGpu": {"big": {"count": 1, "memoryMiB": 10}}}}},
      "nodes": []}, "not a MIG profile name"),
    ({"flavours": {"f": {"product": "P", "family": "hopper", "computeMajor": 9, "computeMinor": 0,
                         "gpus": 1, "gpuMemoryMiB": 1000, "cpu": "lots", "memory": "1Gi", "pods": 1}},
      "nodes": []}, "'lots' is not a Kubernetes quantity"),
    ({"flavours": {}, "nodes": [{"name": "Bad_Name", "flavour": "x"}]}, "not a valid node name"),
])
def test_bad_nodes_file_is_rejected_with_a_clear_error(document, message):
    with pytest.raises(gpunodes.NodesFileError, match=message):
        gpunodes.parse_nodes(document)


def test_duplicate_node_names_are_rejected():
    document = gpunodes.yaml.safe_load(gpunodes.NODES_FILE.read_text())
    document["nodes"].append(dict(document["nodes"][0]))
    with pytest.raises(gpunodes.NodesFileError, match="duplicate node name"):
        gpunodes.parse_nodes(document)


# ---------------------------------------------------------------------------
# Against the session cluster


def test_gpu_nodes_keep_their_capacity_and_are_ready(cluster, kubectl):
    nodes = {n["metadata"]["name"]: n for n in get_json(kubectl, "nodes")["items"]}
    declared = gpunodes.node_manifests(gpunodes.load_nodes())
    for manifest in declared:
        node = nodes[manifest["metadata"]["name"]]
        assert condition(node, "Ready") == "True"
        for resource, quantity in manifest["status"]["allocatable"].items():
            assert node["status"]["allocatable"][resource] == quantity, (node["metadata"]["name"], resource)
        for label, value in manifest["metadata"]["labels"].items():
            assert node["metadata"]["labels"].get(label) == value


def test_gpu_memory_deployment_is_scheduled_and_becomes_ready(cluster, kubectl, namespace):
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "gpu-mem"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "gpu-mem"}},
                 "template": {"metadata": {"labels": {"app": "gpu-mem"}},
                              "spec": pod_manifest("x", {"nvidia.com/gpu.memory": 40000})["spec"]}},
    }
    apply(kubectl, namespace, deployment)
    kubectl("rollout", "status", "deployment/gpu-mem", "-n", namespace, "--timeout=120s", timeout=150)
    pods = get_json(kubectl, "pods", "-n", namespace, "-l", "app=gpu-mem")["items"]
    assert len(pods) == 1
    pod = pods[0]
    assert pod["status"]["phase"] == "Running"
    assert condition(pod, "Ready") == "True"
    assert condition(pod, "PodScheduled") == "True"
    node = get_json(kubectl, "node", pod["spec"]["nodeName"])
    assert int(node["status"]["allocatable"]["nvidia.com/gpu.memory"]) >= 40000
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_mig_pod_lands_on_the_mig_node(cluster, kubectl, namespace):
    apply(kubectl, namespace, pod_manifest("mig", {"nvidia.com/mig-3g.71gb": 1}))

    def ready_pod():
        pod = get_json(kubectl, "pod", "mig", "-n", namespace)
        return pod if condition(pod, "Ready") == "True" else None

    pod = wait_until(ready_pod, "the MIG pod to become Ready")
    assert pod["spec"]["nodeName"] == "gpu-h200-mig-0"


def test_oversized_pod_stays_pending_with_a_failed_scheduling_event(cluster, kubectl, namespace):
    biggest = max(int(m["status"]["allocatable"].get("nvidia.com/gpu.memory", 0))
                  for m in gpunodes.node_manifests(gpunodes.load_nodes()))
    apply(kubectl, namespace, pod_manifest("too-big", {"nvidia.com/gpu.memory": biggest + 1}))

    def failed_scheduling_events():
        events = get_json(kubectl, "events", "-n", namespace,
                          "--field-selector", "involvedObject.name=too-big,reason=FailedScheduling")["items"]
        return events or None

    events = wait_until(failed_scheduling_events, "a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu.memory" in events[0]["message"]
    assert events[0]["type"] == "Warning"
    pod = get_json(kubectl, "pod", "too-big", "-n", namespace)
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    assert condition(pod, "PodScheduled") == "False"


def test_job_pod_completes(cluster, kubectl, namespace):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"},
           "spec": {"backoffLimit": 0, "template": {"spec": {
               **pod_manifest("x", {"nvidia.com/gpu": 1}, restartPolicy="Never")["spec"]}}}}
    apply(kubectl, namespace, job)
    kubectl("wait", "--for=condition=Complete", "job/once", "-n", namespace, "--timeout=120s", timeout=150)
    pods = get_json(kubectl, "pods", "-n", namespace, "-l", "job-name=once")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded"]
    assert get_json(kubectl, "job", "once", "-n", namespace)["status"]["succeeded"] == 1


def test_deleting_an_owner_garbage_collects_its_dependents(cluster, kubectl, namespace):
    kubectl("create", "configmap", "owner", "-n", namespace, "--from-literal=role=owner")
    owner_uid = get_json(kubectl, "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    reference = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}]
    apply(kubectl, namespace, {"apiVersion": "v1", "kind": "ConfigMap",
                               "metadata": {"name": "dependent", "ownerReferences": reference},
                               "data": {"role": "dependent"}})
    apply(kubectl, namespace, {"apiVersion": "v1", "kind": "Secret",
                               "metadata": {"name": "dependent-secret", "ownerReferences": reference},
                               "stringData": {"role": "dependent"}})
    kubectl("delete", "configmap", "owner", "-n", namespace, "--cascade=background")

    def dependents_gone():
        left = kubectl("get", "configmap/dependent", "secret/dependent-secret", "-n", namespace,
                       "--ignore-not-found", "-o", "name").stdout.split()
        return not left
    wait_until(dependents_gone, "the garbage collector to delete the dependents")


def test_helm_install_and_uninstall_a_chart(cluster, namespace, kubectl):
    chart = str(TESTDATA / "tiny-chart")
    cluster.helm("install", "tiny", chart, "-n", namespace, "--set", "greeting=hi", "--wait", "--timeout", "2m")
    releases = json.loads(cluster.helm("list", "-n", namespace, "-o", "json").stdout)
    assert [(r["name"], r["status"]) for r in releases] == [("tiny", "deployed")]
    assert get_json(kubectl, "configmap", "tiny-greeting", "-n", namespace)["data"] == {"greeting": "hi"}
    deployment = get_json(kubectl, "deployment", "tiny-web", "-n", namespace)
    assert deployment["status"].get("readyReplicas") == 1

    cluster.helm("uninstall", "tiny", "-n", namespace, "--wait", "--timeout", "2m")
    assert json.loads(cluster.helm("list", "-n", namespace, "-o", "json").stdout) == []
    left = kubectl("get", "configmap/tiny-greeting", "deployment/tiny-web", "-n", namespace,
                   "--ignore-not-found", "-o", "name").stdout.split()
    assert left == []
    release_secrets = kubectl("get", "secrets", "-n", namespace, "-l", "owner=helm", "-o", "name").stdout.split()
    assert release_secrets == []


# ---------------------------------------------------------------------------
# A second, private cluster: lifecycle


def test_start_and_stop_twice_leaves_no_processes_or_ports(cluster_bin_dir, tmp_path):
    """Once through the Python API, once through the CLI (whose processes outlive it)."""
    name = f"lifecycle-{os.getpid()}"
    lifecycle = localcluster.LocalCluster(name, home=tmp_path, bin_dir=cluster_bin_dir)
    cli_env = {**os.environ, "CHATTTS_CLUSTER_HOME": str(tmp_path), "CHATTTS_CLUSTER_BIN_DIR": str(cluster_bin_dir)}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(CLI), *args, "--name", name], env=cli_env,
                              capture_output=True, text=True, timeout=400)

    try:
        for round_ in ("api", "cli"):
            if round_ == "api":
                lifecycle.start()
            else:
                up = cli("up")
                assert up.returncode == 0, up.stderr
                assert up.stdout.strip() == f"export KUBECONFIG={lifecycle.kubeconfig}"
                assert cli("status").returncode == 0
            assert lifecycle.is_running()
            pids = {c: lifecycle.pid(c) for c in localcluster.COMPONENTS}
            ports = lifecycle.ports.all()
            assert all(pids.values())
            assert localcluster.listening_ports(ports) == ports

            # A second start reuses the healthy cluster: same processes.
            lifecycle.start()
            assert {c: lifecycle.pid(c) for c in localcluster.COMPONENTS} == pids

            if round_ == "api":
                # A lost pid file must not leave its process behind.
                (lifecycle.run_dir / "kwok.pid").unlink()
                lifecycle.stop()
            else:
                assert cli("down").returncode == 0
                assert cli("status").returncode == 1
            assert localcluster.processes_mentioning(str(lifecycle.dir) + "/") == []
            assert all(localcluster.process_state(pid) in (None, "Z") for pid in pids.values())
            assert localcluster.listening_ports(ports) == set()
            lifecycle.stop()  # stopping a stopped cluster is a no-op
    finally:
        lifecycle.stop(purge=True)
    assert not lifecycle.dir.exists()


def test_restarting_etcd_and_apiserver_keeps_the_data(cluster_bin_dir, tmp_path):
    """restart(component) for fault tests: the cluster comes back with its objects."""
    faulty = localcluster.LocalCluster(f"restart-{os.getpid()}", home=tmp_path, bin_dir=cluster_bin_dir)
    try:
        faulty.start()
        faulty.kubectl("create", "configmap", "survivor", "--from-literal=k=v")
        old_etcd = faulty.pid("etcd")
        faulty.restart("etcd", sig=9)  # a crash, not a clean stop
        assert faulty.pid("etcd") not in (None, old_etcd)
        faulty.restart("kube-apiserver")
        faulty.wait_healthy(timeout=60)
        got = json.loads(faulty.kubectl("get", "configmap", "survivor", "-o", "json").stdout)
        assert got["data"] == {"k": "v"}
    finally:
        faulty.stop(purge=True)
