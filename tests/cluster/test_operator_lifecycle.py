"""The operator against the real local control plane (kube-apiserver, controller-manager,
scheduler, kwok GPU nodes). The operator runs as a subprocess (`python -m chattts_operator
run`), exactly as its container does, so it can also be killed with SIGKILL mid-way."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.test_operator_crd import install_crds

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
INSTANCE = "app.kubernetes.io/instance"
MANAGED = "app.kubernetes.io/managed-by=chattts-operator"
CHILD_KINDS = ("deployment", "configmap", "service", "poddisruptionbudget")


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = 120, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = predicate()
        except Exception as err:  # noqa: BLE001 - keep polling, report the last error on timeout
            value, last = None, err
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last})" if last else ""))
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    def __init__(self, cluster, namespace: str, log_dir: Path, **settings: str) -> None:
        self.cluster, self.namespace, self.log_dir = cluster, namespace, log_dir
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.env = {
            **os.environ,
            "KUBECONFIG": str(cluster.kubeconfig),
            "CHATTTS_OPERATOR_METRICS_PORT": str(self.metrics_port),
            "CHATTTS_OPERATOR_HEALTH_PORT": str(self.health_port),
            "CHATTTS_OPERATOR_MIG_PROFILES": "1g.18gb,2g.35gb,3g.71gb",
            "CHATTTS_OPERATOR_RUNTIME_IMAGE": "chattts-runtime:test",
            **{f"CHATTTS_OPERATOR_{k.upper()}": v for k, v in settings.items()},
        }
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> "OperatorProcess":
        self.starts += 1
        log = open(self.log_dir / f"operator-{self.starts}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "chattts_operator", "run", "--namespace", self.namespace, "--verbose"],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )
        wait_until(lambda: self._healthy(), "the operator's liveness endpoint", timeout=60)
        return self

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, lines: int = 60) -> str:
        path = self.log_dir / f"operator-{self.starts}.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def metric_sum(self, name: str, **labels: str) -> float:
        return sum(v for (n, ls), v in self.metrics().items()
                   if n == name and all(dict(ls).get(k) == val for k, val in labels.items()))


@pytest.fixture(scope="module")
def crds(cluster):
    install_crds(cluster)
    return cluster


@pytest.fixture
def operator_factory(crds, namespace, tmp_path):
    started: list[OperatorProcess] = []

    def make(**settings: str) -> OperatorProcess:
        op = OperatorProcess(crds, namespace, tmp_path, **settings)
        started.append(op)
        return op

    yield make
    for op in started:
        op.stop()
        print(f"--- operator log (start {op.starts}) ---\n{op.log_tail()}")  # shown when the test fails


@pytest.fixture
def operator(operator_factory):
    return operator_factory().start()


def ctd(name: str, **spec: Any) -> dict[str, Any]:
    body = {"model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"}, "gpu": {"memory": "8Gi"},
            "replicas": 2}
    body.update(spec)
    return {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment", "metadata": {"name": name},
            "spec": body}


def apply(kubectl, namespace: str, *objs: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                    "items": list(objs)}))


def get(kubectl, namespace: str, *args: str) -> Any:
    return json.loads(kubectl("get", "-n", namespace, *args, "-o", "json").stdout)


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
    assert "max_num_seqs: 32" in get(kubectl, namespace, "configmap", "tts-runtime")["data"]["runtime.yaml"]

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
    for kind, child in (("deployment", name), ("configmap", f"{name}-runtime"), ("service", name),
                        ("poddisruptionbudget", name)):
        out[kind] = get(kubectl, namespace, kind, child)["metadata"]["resourceVersion"]
    return out


def test_noop_resync_writes_nothing_hand_edits_are_reverted_and_scale_works(crds, namespace, operator_factory):
    kubectl = crds.kubectl
    op = operator_factory(resync_interval_seconds="1").start()
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
    kubectl("patch", "configmap", "tts-runtime", "-n", namespace, "--type=merge", "-p",
            '{"data":{"runtime.yaml":"engine: {}\\n"}}')
    wait_until(lambda: "max_num_seqs" in get(kubectl, namespace, "configmap", "tts-runtime")["data"]["runtime.yaml"],
               "ConfigMap edit reverted", timeout=30)
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


def test_killed_operator_restarts_without_duplicate_or_lost_children(crds, namespace, operator_factory):
    kubectl = crds.kubectl
    names = [f"tts-{i}" for i in range(6)]
    first = operator_factory().start()
    apply(kubectl, namespace, *[ctd(n, replicas=1) for n in names])
    # Kill it mid-way: once some, but typically not all, children exist.
    wait_until(lambda: children(kubectl, namespace)["deployment"], "the first Deployment", timeout=60, interval=0.1)
    first.stop(signal.SIGKILL)
    seen = children(kubectl, namespace)

    operator_factory().start()
    for name in names:
        wait_until(lambda: ready(kubectl, namespace, name), f"{name} Ready", timeout=180)
    final = children(kubectl, namespace)
    for kind in CHILD_KINDS:
        expected = {f"{n}-runtime" if kind == "configmap" else n for n in names}
        assert set(final[kind]) == expected, kind
        # Children made before the kill were kept, not recreated.
        for name, uid in seen[kind].items():
            assert final[kind][name] == uid, f"{kind} {name} was recreated"
    # One ReplicaSet per Deployment: nothing rolled twice.
    replicasets = get(kubectl, namespace, "replicasets")["items"]
    assert sorted(rs["metadata"]["labels"][INSTANCE] for rs in replicasets) == sorted(names)
