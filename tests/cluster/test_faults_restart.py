"""Control-plane restarts under a running operator: kube-apiserver (with etcd compacted
meanwhile, so every watch's resourceVersion has expired: 410 Gone) and an etcd crash.

These run on a cluster of their own (``faults-<pid>``), not the session cluster: restarting
the session cluster's API server would break whatever other tests of the session hold open
against it (module-scoped operators, watches, port-forwards). The price is one more control
plane start (~30-60 s on two cores) for this module.
"""
from __future__ import annotations

import base64
import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import localcluster
from bench.operator_scale.operatorproc import OperatorProcess
from chattts_operator.deployment.children import mounted_configmap
from tests.cluster.helpers import CHILD_KINDS, INSTANCE, MANAGED, converged, expected_config_hash, kube_list
from tests.support import ctd, install_crds, wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def own_cluster(cluster_bin_dir: Path):
    cluster = localcluster.LocalCluster(f"faults-{os.getpid()}", bin_dir=cluster_bin_dir)
    try:
        cluster.start()
        install_crds(cluster)
        yield cluster
    finally:
        cluster.stop(purge=True)


@pytest.fixture
def own_namespace(own_cluster, request) -> str:
    name = f"faults-{request.node.name[5:30].replace('_', '-').strip('-')}"
    own_cluster.kubectl("create", "namespace", name)
    wait_until(lambda: own_cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False)
               .returncode == 0, "the default ServiceAccount", timeout=60, interval=0.3)
    return name


@pytest.fixture
def operator(own_cluster, own_namespace, tmp_path):
    # --verbose: kopf logs watch-stream restarts after 410 Gone at DEBUG level.
    op = OperatorProcess(own_cluster.kubeconfig, tmp_path, namespaces=(own_namespace,), verbose=True,
                         resync_interval_seconds="30", upstream_data_interval_seconds="0").start()
    yield op
    op.stop()
    print(f"--- operator log ---\n{op.log_tail(40)}")


# --- etcd's JSON gateway (no etcdctl needed) -------------------------------------------------------


def etcd_call(cluster: localcluster.LocalCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{cluster.ports.etcd_client}{path}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def expire_resource_versions(cluster: localcluster.LocalCluster) -> int:
    """Write outside the API server's keyspace, then compact etcd at the newest revision:
    every resourceVersion a client holds is now older than what etcd (and a fresh watch
    cache) can serve, so resuming a watch from it answers 410 Gone."""
    for i in range(3):
        etcd_call(cluster, "/v3/kv/put", {"key": b64(f"/chattts-faults/bump-{i}"), "value": b64(str(time.time()))})
    revision = int(etcd_call(cluster, "/v3/kv/range", {"key": b64("/chattts-faults/bump-0")})["header"]["revision"])
    etcd_call(cluster, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    return revision


# --- shared scenario -------------------------------------------------------------------------------


def apply_all(kubectl, namespace: str, objs: list[dict[str, Any]]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}), timeout=120)


def patch_seqs(kubectl, namespace: str, names: list[str], value: int) -> None:
    for name in names:
        kubectl("patch", "ctd", name, "-n", namespace, "--type=merge",
                "-p", json.dumps({"spec": {"engine": {"maxNumSeqs": value}}}))


class NotSettled(AssertionError):
    """What still differs from the expected end state (the wait reports the last one)."""


def settled(kubectl, namespace: str, expected: dict[str, int]) -> bool:
    """Exactly the expected objects, each converged with its newest spec in its Deployment, and
    the children of deleted objects collected; otherwise NotSettled says what differs."""
    objs = {o["metadata"]["name"]: o for o in kube_list(kubectl, namespace, "ctd")}
    if set(objs) != set(expected):
        raise NotSettled(f"objects {sorted(objs)}, expected {sorted(expected)}")
    for name, obj in objs.items():
        if not converged(obj):
            status = obj.get("status") or {}
            raise NotSettled(f"{name} not converged: generation {obj['metadata']['generation']}, status "
                             f"{ {k: status.get(k) for k in ('observedGeneration', 'appliedGeneration', 'phase', 'readyReplicas')} }")
        if obj["spec"]["engine"]["maxNumSeqs"] != expected[name]:
            raise NotSettled(f"{name} has maxNumSeqs {obj['spec']['engine']['maxNumSeqs']}, expected {expected[name]}")
    deployments = {d["metadata"]["name"]: d for d in kube_list(kubectl, namespace, "deployments", "-l", MANAGED)}
    if set(deployments) != set(expected):
        raise NotSettled(f"Deployments {sorted(deployments)}, expected {sorted(expected)}")
    for name, obj in objs.items():
        annotations = deployments[name]["spec"]["template"]["metadata"].get("annotations") or {}
        if annotations.get("chattts.io/config-hash") != expected_config_hash(obj):
            raise NotSettled(f"{name}'s Deployment has an old config hash")
    children = kube_list(kubectl, namespace, ",".join(CHILD_KINDS), "-l", MANAGED)
    # One of each per object, but runtime ConfigMaps: content-addressed, the one the Deployment
    # mounts must exist, and an older one may stay while a ReplicaSet of its Deployment mounts it.
    configmaps = {c["metadata"]["name"] for c in children if c["kind"] == "ConfigMap"}
    others = [c for c in children if c["kind"] != "ConfigMap"]
    owners = {c["metadata"]["labels"][INSTANCE] for c in children}
    if len(others) != 3 * len(expected) or owners != set(expected):
        names = sorted(f"{c['kind']}/{c['metadata']['name']}" for c in children)
        raise NotSettled(f"{len(children)} children of {sorted(owners)}, expected three and the runtime "
                         f"ConfigMaps of each of {sorted(expected)}: {names}")
    for name, deployment in deployments.items():
        if mounted_configmap(deployment) not in configmaps:
            raise NotSettled(f"{name}'s runtime ConfigMap {mounted_configmap(deployment)} is missing")
    return True


def run_scenario(cluster, namespace: str, op: OperatorProcess, fault) -> float:
    """Eight objects served; four spec changes land just before ``fault()``; after it, two more
    changes, two creates, two deletes. Returns seconds from the fault's end to convergence."""
    kubectl = cluster.kubectl
    names = [f"tts-{i}" for i in range(8)]
    apply_all(kubectl, namespace, [ctd(n, replicas=1) for n in names])
    expected = {n: 64 for n in names}
    wait_until(lambda: settled(kubectl, namespace, expected), "eight objects Ready", timeout=180)

    patch_seqs(kubectl, namespace, names[:4], 96)  # in flight when the fault hits
    expected.update({n: 96 for n in names[:4]})
    fault()
    back = time.monotonic()
    wait_until(lambda: cluster.kubectl("get", "--raw", "/readyz", check=False).returncode == 0,
               "the API server to be ready", timeout=120)
    patch_seqs(kubectl, namespace, names[4:6], 112)
    expected.update({n: 112 for n in names[4:6]})
    apply_all(kubectl, namespace, [ctd("tts-new-0", replicas=1), ctd("tts-new-1", replicas=1)])
    expected.update({"tts-new-0": 64, "tts-new-1": 64})
    kubectl("delete", "ctd", names[6], names[7], "-n", namespace, "--wait=false")
    for name in names[6:]:
        expected.pop(name)
    wait_until(lambda: settled(kubectl, namespace, expected), "convergence after the fault", timeout=240, interval=1)
    recovery = time.monotonic() - back
    assert op.running() and op.starts == 1, "the operator restarted (crash) instead of reconnecting"
    return recovery


def test_apiserver_restart_with_expired_resource_versions_converges(own_cluster, own_namespace, operator):
    def fault() -> None:
        own_cluster.stop_component("kube-apiserver")
        expire_resource_versions(own_cluster)
        own_cluster.start_component("kube-apiserver")

    recovery = run_scenario(own_cluster, own_namespace, operator, fault)
    print(f"\nkube-apiserver restart (etcd compacted meanwhile): converged {recovery:.1f}s after it was back")
    # kopf resumed its watches from resourceVersions that no longer exist: 410 Gone, then a relist.
    assert "Restarting the watch-stream" in operator.log_text()


def test_etcd_crash_during_operation_converges(own_cluster, own_namespace, operator):
    def fault() -> None:
        own_cluster.stop_component("etcd", sig=signal.SIGKILL)
        time.sleep(5)  # the operator's requests fail meanwhile (the API server answers 5xx/timeouts)
        own_cluster.start_component("etcd")

    recovery = run_scenario(own_cluster, own_namespace, operator, fault)
    print(f"\netcd crash (SIGKILL, 5 s down): converged {recovery:.1f}s after it was back")


def test_a_deletion_the_operator_never_saw_is_noticed_and_its_children_stay_gone(own_cluster, own_namespace, operator):
    """The operator is frozen while the API server restarts and an object is deleted: its watches then
    relist, and a relist reports no deletions. The children's collection (owner references) must make
    the operator look, forget the object and never re-create them (not even at a resync)."""
    kubectl = own_cluster.kubectl
    apply_all(kubectl, own_namespace, [ctd("kept", replicas=1), ctd("deleted", replicas=1)])
    expected = {"kept": 64, "deleted": 64}
    wait_until(lambda: settled(kubectl, own_namespace, expected), "both objects Ready", timeout=180)
    os.kill(operator.pid, signal.SIGSTOP)
    try:
        own_cluster.stop_component("kube-apiserver")  # every watch connection of the operator breaks
        expire_resource_versions(own_cluster)  # and none can resume where it was: all relist
        own_cluster.start_component("kube-apiserver")
        kubectl("delete", "ctd", "deleted", "-n", own_namespace, "--wait=false")
        wait_until(lambda: kubectl("get", "ctd", "deleted", "-n", own_namespace, check=False).returncode != 0,
                   "the object to be gone", timeout=60)
    finally:
        os.kill(operator.pid, signal.SIGCONT)
    expected.pop("deleted")
    wait_until(lambda: settled(kubectl, own_namespace, expected), "the deleted object's children collected",
               timeout=180, interval=1)
    time.sleep(35)  # past a resync (30 s here): nothing comes back
    assert settled(kubectl, own_namespace, expected)
    assert "is gone (its deletion was not seen)" in operator.log_text()
