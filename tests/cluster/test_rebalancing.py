"""Day/night GPU rebalancing and AWQ quantization on the real local control plane.

The operator (every handler: the core reconcile, the autoscaler, the share policy) runs in
this process under kopf's KopfRunner, so the test can install a manual clock and compress
a day into a few minutes. The rebalancing test brings its own GPU pool: simulated nodes
managed by a private kwok whose stages never complete pods (offline Jobs run until they are
suspended), tainted so no other test's pods land there. A monitor samples the cluster
all along and checks that what the members ask never exceeds the pool.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import kubernetes
import pytest
import yaml
from kopf.testing import KopfRunner

import localcluster
from chattts_operator.core import clock
from chattts_operator.core.metrics import REGISTRY
from chattts_operator.api.common import parse_live_quantity as parse_quantity
from chattts_operator.deployment.gpu import mig_profile_memory_mib
from tests.cluster.helpers import runtime_yaml
from tests.support import TEST_ENGINE, install_crds, wait_until

REPO = Path(__file__).resolve().parents[2]
POOL_KEY = "chattts.io/rebalancing-pool"
SHARE_LABEL = "tts.chattts.io/share-policy"
CAP = "tts.chattts.io/replica-cap"
GPU_MEMORY = "nvidia.com/gpu.memory"
NODE_MIB = 100_000
REPLICA_MIB = 10_000
JOB_MIB = 20_000
MONDAY_NIGHT = datetime(2026, 6, 1, 6, 0, tzinfo=timezone.utc)


def kjson(cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def apply(cluster, namespace: str | None, *objs: dict[str, Any]) -> None:
    scope = ["-n", namespace] if namespace else []
    cluster.kubectl("apply", *scope, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))


# --- the operator, in process, with a manual clock ----------------------------------------------


@pytest.fixture
def manual_clock() -> Iterator[clock.ManualClock]:
    manual = clock.ManualClock(MONDAY_NIGHT)
    clock.set_clock(manual)
    yield manual
    clock.set_clock(None)


@pytest.fixture
def operator(cluster, namespace, manual_clock, monkeypatch) -> Iterator[KopfRunner]:
    install_crds(cluster)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/gpusharepolicies.tts.chattts.io")
    for key, value in {
        "CHATTTS_OPERATOR_METRICS_PORT": "0",
        "CHATTTS_OPERATOR_HEALTH_PORT": "0",
        "CHATTTS_OPERATOR_RESYNC_INTERVAL_SECONDS": "2",
        "CHATTTS_OPERATOR_RUNTIME_IMAGE": "chattts-runtime:test",
        # A day's pacing compressed with the clock.
        "CHATTTS_SHAREPOLICY_RESYNC_SECONDS": "0.5",
        "CHATTTS_SHAREPOLICY_SETTLE_SECONDS": "0.3",
        "CHATTTS_SHAREPOLICY_MIN_INTERVAL_SECONDS": "0.1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    # Both clients read $KUBECONFIG once, at import; this process imported them already.
    import kubernetes.config.kube_config
    import kubernetes_asyncio.config.kube_config
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.kubeconfig))
    monkeypatch.setattr(kubernetes_asyncio.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cluster.kubeconfig))
    runner = KopfRunner(["run", "--standalone", "--namespace", namespace, "-m", "chattts_operator.handlers"],
                        timeout=60)
    with runner:
        yield runner
    print(runner.output[-20000:])  # shown when the test fails


# --- a private GPU pool -------------------------------------------------------------------------


class GpuPool:
    """Simulated GPU nodes only this test uses, and the kwok that runs their pods."""

    def __init__(self, cluster, namespace: str, workdir: Path) -> None:
        self.cluster, self.namespace, self.workdir = cluster, namespace, workdir
        self.nodes: list[str] = []
        self.proc: subprocess.Popen | None = None

    @property
    def selector(self) -> dict[str, str]:
        return {POOL_KEY: self.namespace}

    def start_kwok(self) -> None:
        stages_dir = localcluster.default_bin_dir() / "kwok-stages"
        # No pod-complete stage: an offline pod runs until its Job is suspended.
        stages = [(stages_dir / f).read_text().strip() for f in
                  ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-ready.yaml", "pod-delete.yaml")]
        config = self.workdir / "kwok-stages.yaml"
        config.write_text("\n---\n".join(stages) + "\n")
        port = localcluster.free_ports(1)[0]
        log = open(self.workdir / "kwok.log", "w")
        self.proc = subprocess.Popen(
            [str(localcluster.default_bin_dir() / "kwok"), f"--kubeconfig={self.cluster.kubeconfig}",
             f"--config={config}", "--manage-all-nodes=false",
             f"--manage-nodes-with-annotation-selector={POOL_KEY}={self.namespace}",
             "--cidr=10.213.0.0/16", "--node-ip=10.213.0.1",
             f"--server-address=127.0.0.1:{port}", f"--node-port={port}", "--node-lease-duration-seconds=40"],
            stdout=log, stderr=subprocess.STDOUT,
        )

    def add_node(self) -> str:
        name = f"{self.namespace}-gpu-{len(self.nodes)}"[:63]
        resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "2", GPU_MEMORY: str(NODE_MIB)}
        node = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {POOL_KEY: self.namespace, "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {**self.selector, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "type": "kwok", "nvidia.com/gpu.product": "TEST-GPU", "nvidia.com/gpu.count": "2",
                           "nvidia.com/gpu.memory": str(NODE_MIB // 2)},
            },
            "spec": {"taints": [{"key": POOL_KEY, "value": self.namespace, "effect": "NoSchedule"}]},
            "status": {"capacity": resources, "allocatable": resources},
        }
        self.cluster.kubectl("create", "-f", "-", input=json.dumps(node))
        self.cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
                             json.dumps({"status": {"capacity": resources, "allocatable": resources}}))
        self.nodes.append(name)
        wait_until(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                               for c in kjson(self.cluster, "get", "node", name)["status"].get("conditions", [])),
                   f"node {name} Ready under the private kwok", timeout=60)
        return name

    def pod_placement(self) -> dict[str, Any]:
        return {
            "nodeSelector": dict(self.selector),
            "tolerations": [{"key": POOL_KEY, "operator": "Equal", "value": self.namespace, "effect": "NoSchedule"}],
        }

    def close(self) -> None:
        for name in self.nodes:
            self.cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def gpu_pool(cluster, namespace, tmp_path) -> Iterator[GpuPool]:
    pool = GpuPool(cluster, namespace, tmp_path)
    try:
        pool.start_kwok()
        pool.add_node()
        yield pool
    finally:
        pool.close()


# --- the invariant, sampled from the cluster -----------------------------------------------------


class Monitor(threading.Thread):
    """Samples the cluster and records every instant at which members ask for more GPU memory
    than the pool has. Asked: a member Deployment's pods, or as many as it is set to run if
    more; a running Job's pods or its parallelism, a suspended one's pods still there."""

    def __init__(self, cluster, namespace: str, pool: GpuPool, ctd: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.pool, self.ctd = cluster, namespace, pool, ctd
        self.stop_event = threading.Event()
        self.samples = 0
        self.violations: list[str] = []
        self.errors = 0
        self.last_error: Exception | None = None
        self.fullest = 0.0  # the largest share of the pool asked at any sample
        self.api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))

    def sample(self) -> None:
        core, batch, apps = (kubernetes.client.CoreV1Api(self.api), kubernetes.client.BatchV1Api(self.api),
                             kubernetes.client.AppsV1Api(self.api))
        nodes = self._read(core.list_node, label_selector=f"{POOL_KEY}={self.namespace}")["items"]
        # The API server canonicalises quantities: 100000 reads back as "100k".
        pool_mib = sum(int(parse_quantity(n["status"]["allocatable"].get(GPU_MEMORY, 0))) for n in nodes
                       if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])))
        ns = self.namespace
        pods = [p for p in self._read(core.list_namespaced_pod, ns)["items"]
                if p["status"].get("phase") not in ("Succeeded", "Failed")]
        jobs = self._read(batch.list_namespaced_job, ns)["items"]
        deployments = self._read(apps.list_namespaced_deployment, ns)["items"]
        serving = [p for p in pods if p["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == self.ctd]
        deployment = next((d for d in deployments if d["metadata"]["name"] == self.ctd), None)
        set_to = max(deployment["spec"].get("replicas", 0), deployment.get("status", {}).get("replicas", 0)) if deployment else 0
        asked = max(len(serving), set_to) * REPLICA_MIB
        for job in jobs:
            live = sum(1 for p in pods if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == job["metadata"]["name"])
            running = not job["spec"].get("suspend")
            asked += (max(live, job["spec"].get("parallelism", 1)) if running else live) * JOB_MIB
        self.samples += 1
        self.fullest = max(self.fullest, asked / pool_mib if pool_mib else 0.0)
        if asked > pool_mib:
            self.violations.append(f"{datetime.now(timezone.utc).isoformat()}: asked {asked} MiB > pool {pool_mib} MiB")

    @staticmethod
    def _read(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # The sync client, raw JSON: kubectl is too slow to sample often.
        return json.loads(call(*args, _preload_content=False, **kwargs).data)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.sample()
            except Exception as err:  # noqa: BLE001 - a failed read is retried; too many fail the test
                self.errors += 1
                self.last_error = err
            self.stop_event.wait(0.05)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


# --- the objects --------------------------------------------------------------------------------


def policy(name: str, pool: GpuPool) -> dict[str, Any]:
    return {
        "apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy", "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"matchLabels": pool.selector},
            "timezone": "UTC",
            "windows": [
                {"name": "day", "start": "08:00", "end": "20:00", "online": 80, "offline": 20},
                {"name": "night", "start": "20:00", "end": "08:00", "online": 60, "offline": 40},
            ],
        },
    }


def serving(name: str, policy_name: str, pool: GpuPool, replicas: int) -> dict[str, Any]:
    placement = pool.pod_placement()
    return {
        "apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment",
        "metadata": {"name": name, "labels": {SHARE_LABEL: policy_name}},
        "spec": {
            "replicas": replicas,
            "model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"},
            "gpu": {"memory": f"{REPLICA_MIB}Mi", "profile": "gpu-memory", "nodeSelector": placement["nodeSelector"]},
            "engine": dict(TEST_ENGINE),  # the graph engine's caches fit the replica's share at this length
            "tolerations": placement["tolerations"],
        },
    }


def offline_job(name: str, policy_name: str, pool: GpuPool, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": {SHARE_LABEL: policy_name},
                     "annotations": {"tts.chattts.io/offline-priority": str(priority)}},
        "spec": {
            "suspend": True, "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never", "priorityClassName": "chattts-offline", **pool.pod_placement(),
                "containers": [{"name": "work", "image": "registry.invalid/batch:1",
                                "resources": {"limits": {GPU_MEMORY: str(JOB_MIB)}}}],
            }},
        },
    }


def state(cluster, namespace: str, ctd: str, policy_name: str) -> dict[str, Any]:
    objs = kjson(cluster, "get", "pods,jobs,deployments", "-n", namespace)["items"]
    obj = kjson(cluster, "get", "ctd", ctd, "-n", namespace)
    pol = kjson(cluster, "get", "gpusharepolicy", policy_name)
    running_pods = [o for o in objs if o["kind"] == "Pod" and o["status"].get("phase") == "Running"
                    and not o["metadata"].get("deletionTimestamp")]
    deployment = next((o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == ctd), {})
    return {
        "cap": (obj["metadata"].get("annotations") or {}).get(CAP),
        "deployment_replicas": (deployment.get("spec") or {}).get("replicas"),
        "serving_pods": sum(1 for p in running_pods if p["metadata"]["labels"].get("app.kubernetes.io/instance") == ctd),
        "jobs_running": sorted(o["metadata"]["name"] for o in objs if o["kind"] == "Job" and not o["spec"].get("suspend")),
        "job_pods": sorted(p["metadata"]["labels"].get("batch.kubernetes.io/job-name") for p in running_pods
                           if p["metadata"]["labels"].get("batch.kubernetes.io/job-name")),
        "window": (pol.get("status") or {}).get("window"),
        "status": pol.get("status") or {},
    }


def expect(cluster, namespace: str, ctd: str, policy_name: str, *, window: str, replicas: int, jobs: list[str],
           timeout: float = 120) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        s = state(cluster, namespace, ctd, policy_name)
        balanced = any(c["type"] == "Balanced" and c["status"] == "True" for c in s["status"].get("conditions", []))
        used = (s["status"].get("used") or {}).get("totalMiB")
        ok = (s["window"] == window and s["cap"] == str(replicas) and s["deployment_replicas"] == replicas
              and s["serving_pods"] == replicas and s["jobs_running"] == jobs and s["job_pods"] == jobs
              and balanced and used == replicas * REPLICA_MIB + len(jobs) * JOB_MIB)
        return s if ok else None
    try:
        return wait_until(settled, f"window {window}: {replicas} serving replicas and jobs {jobs}", timeout=timeout)
    except AssertionError:
        s = state(cluster, namespace, ctd, policy_name)
        s["status"] = {k: s["status"].get(k) for k in ("window", "used", "budget", "conditions", "lastActions")}
        raise AssertionError(f"not settled: {json.dumps(s, indent=1, default=str)}") from None


def assert_quiet(cluster, policy_name: str, seconds: float = 3.0, within: float = 30.0) -> None:
    """A settled policy's passes run and write nothing: within ``within`` seconds there is a
    window of ``seconds`` in which the policy's loop ran several passes and the object was not
    written at all. A write that trails the settle once (the last of a rollout's observations,
    or another writer: the operator's own status-write counter tells which) is reported as a
    warning with what it changed; writes that keep coming fail the test."""
    def counted(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"policy": policy_name}) or 0.0

    trailing: list[str] = []
    deadline = time.monotonic() + within
    before = kjson(cluster, "get", "gpusharepolicy", policy_name)
    while True:
        passes, writes = counted("chattts_sharepolicy_passes_total"), counted("chattts_sharepolicy_status_writes_total")
        time.sleep(seconds)
        after = kjson(cluster, "get", "gpusharepolicy", policy_name)
        ran = counted("chattts_sharepolicy_passes_total") - passes
        ours = counted("chattts_sharepolicy_status_writes_total") - writes
        if after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]:
            assert ours == 0, f"{ours} status writes counted, none reached the object"
            assert ran >= 2, f"only {ran:.0f} passes in {seconds} s: the policy's loop is not running"
            break
        trailing.append(f"{'the operator' if ours else 'another writer'} ({ours:.0f} status writes counted, "
                        f"{ran:.0f} passes): {written_between(before, after)}")
        assert time.monotonic() < deadline, "written again and again while settled:\n" + "\n".join(trailing[-3:])
        before = after
    if trailing:
        warnings.warn("a write trailed the settle: " + "\n".join(trailing), stacklevel=2)


def written_between(before: dict[str, Any], after: dict[str, Any]) -> str:
    """What a write between two reads of an object changed: the status keys and metadata that
    differ (not the whole object: a failure message must fit CI's log), and who wrote them."""
    changed: dict[str, Any] = {}
    for part in ("status", "spec"):
        old, new = before.get(part) or {}, after.get(part) or {}
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                changed[f"{part}.{key}"] = {"before": old.get(key), "after": new.get(key)}
    for key in ("annotations", "labels", "finalizers", "generation"):
        if before["metadata"].get(key) != after["metadata"].get(key):
            changed[f"metadata.{key}"] = {"before": before["metadata"].get(key), "after": after["metadata"].get(key)}
    writers = [{k: f.get(k) for k in ("manager", "operation", "subresource", "time")}
               for f in after["metadata"].get("managedFields") or []]
    return json.dumps({"changed": changed, "writers": writers}, indent=1, default=str)


def action_order(status: dict[str, Any], since: int) -> list[tuple[str, str]]:
    return [(a["action"], a["name"]) for a in status.get("lastActions", [])[since:]]


# --- the tests -----------------------------------------------------------------------------------


def test_a_day_compressed_into_minutes(cluster, namespace, gpu_pool, operator, manual_clock):
    policy_name = f"pool-{namespace}"[:63]
    ctd = "tts"
    monitor = Monitor(cluster, namespace, gpu_pool, ctd)
    try:
        apply(cluster, None, policy(policy_name, gpu_pool))
        apply(cluster, namespace, serving(ctd, policy_name, gpu_pool, replicas=10),
              offline_job("replay-high", policy_name, gpu_pool, 9),
              offline_job("quantize-mid", policy_name, gpu_pool, 5),
              offline_job("synth-low", policy_name, gpu_pool, 1))
        monitor.start()

        # 06:00, night: online 60% of 100,000 MiB = 6 replicas; offline 40% = the two best jobs.
        night = expect(cluster, namespace, ctd, policy_name, window="night", replicas=6,
                       jobs=["quantize-mid", "replay-high"])
        assert night["status"]["nextChange"] == "2026-06-01T08:00:00Z"
        assert night["status"]["budget"] == {"onlineMiB": 60_000, "offlineMiB": 40_000}
        seen = len(night["status"].get("lastActions", []))
        printed = cluster.kubectl("get", "gsp", policy_name).stdout
        assert all(column in printed for column in ("WINDOW", "ONLINE%", "OFFLINE%", "USED-MIB", "NEXT-CHANGE"))
        assert "night" in printed
        # Settled: passes keep running (every 0.5 s here) and write nothing.
        assert_quiet(cluster, policy_name)

        # 08:00, day: online 80% = 8 replicas; offline 20% keeps only the highest-priority job.
        manual_clock.set(datetime(2026, 6, 1, 8, 0, tzinfo=timezone.utc))
        day = expect(cluster, namespace, ctd, policy_name, window="day", replicas=8, jobs=["replay-high"])
        order = action_order(day["status"], seen)
        assert order.index(("Suspend", "quantize-mid")) < order.index(("ScaleUp", ctd)), order
        assert day["status"]["nextChange"] == "2026-06-01T20:00:00Z"
        seen = len(day["status"]["lastActions"])

        # 20:00, night again: online gives back 2 replicas before the job resumes.
        manual_clock.set(datetime(2026, 6, 1, 20, 0, tzinfo=timezone.utc))
        night = expect(cluster, namespace, ctd, policy_name, window="night", replicas=6,
                       jobs=["quantize-mid", "replay-high"])
        order = action_order(night["status"], seen)
        assert order.index(("ScaleDown", ctd)) < order.index(("Resume", "quantize-mid")), order

        # The pool grows at night: another 100,000 MiB node. Online 120,000 holds all 10
        # replicas, offline 80,000 all three jobs.
        gpu_pool.add_node()
        grown = expect(cluster, namespace, ctd, policy_name, window="night", replicas=10,
                       jobs=["quantize-mid", "replay-high", "synth-low"])
        assert grown["status"]["pool"] == {"nodes": 2, "gpuMemoryMiB": 200_000}

        # Tuesday 08:00: day again on the bigger pool: 160,000 online (10 wanted), 40,000 offline.
        manual_clock.set(datetime(2026, 6, 2, 8, 0, tzinfo=timezone.utc))
        expect(cluster, namespace, ctd, policy_name, window="day", replicas=10, jobs=["quantize-mid", "replay-high"])
    finally:
        monitor.stop()
        cluster.kubectl("delete", "gpusharepolicy", policy_name, "--ignore-not-found", "--wait=false", check=False)

    assert monitor.samples >= 30, \
        f"the monitor took only {monitor.samples} samples ({monitor.errors} errors, last: {monitor.last_error!r})"
    assert monitor.violations == [], "\n".join(monitor.violations[:20])
    assert monitor.fullest == 1.0, f"the monitor never saw the pool full (at most {monitor.fullest:.2f})"

    # Online pods may preempt offline ones: the operator made both PriorityClasses.
    online_pc = kjson(cluster, "get", "priorityclass", "chattts-online")
    offline_pc = kjson(cluster, "get", "priorityclass", "chattts-offline")
    assert online_pc["value"] > offline_pc["value"] and offline_pc["preemptionPolicy"] == "Never"
    # Events on the members and on the policy tell the story.
    reasons = {(e["involvedObject"]["kind"], e["reason"])
               for e in kjson(cluster, "get", "events", "-n", namespace)["items"]}
    assert ("Job", "Suspended") in reasons and ("Job", "Resumed") in reasons
    assert ("ChatTTSDeployment", "ReplicaCapChanged") in reasons
    policy_events = {e["reason"] for e in kjson(cluster, "get", "events", "-A", "--field-selector",
                                                  f"involvedObject.name={policy_name}")["items"]}
    assert {"WindowChanged", "Suspended", "Resumed", "ScaledUp", "ScaledDown"} <= policy_events


# --- quantization -------------------------------------------------------------------------------


def static_pvc(cluster, namespace: str, name: str, path: str) -> None:
    """A PVC bound to a hostPath PV (no provisioner here), so pods using it schedule."""
    pv = f"{namespace}-{name}"[:63]
    apply(cluster, None, {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv, "labels": {"chattts.io/test": namespace}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": path},
                 "claimRef": {"namespace": namespace, "name": name}},
    })
    apply(cluster, namespace, {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })


def test_quantization_job_runs_and_serving_switches_to_read_only_awq(cluster, namespace, operator):
    try:
        static_pvc(cluster, namespace, "weights", "/srv/chattts")
        static_pvc(cluster, namespace, "weights-rw", "/srv/chattts-awq")
        apply(cluster, namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "calib"},
                                   "data": {"texts.jsonl": '{"text": "hello"}\n'}})
        apply(cluster, namespace, {
            "apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment", "metadata": {"name": "tts"},
            "spec": {
                "replicas": 2,
                "model": {"pvc": {"claimName": "weights", "subPath": "chattts-fp16"}, "format": "fp16"},
                "gpu": {"memory": "8Gi"},
                "engine": {"maxModelLen": 256},  # the graph engine's slot cache fits 8Gi at this length
                "quantization": {"calibration": {"configMap": {"name": "calib", "key": "texts.jsonl"}},
                                 "output": {"claimName": "weights-rw", "subPath": "awq"}, "nSamples": 8},
            },
        })

        def quantized() -> dict[str, Any] | None:
            obj = kjson(cluster, "get", "ctd", "tts", "-n", namespace)
            cond = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Quantized"), None)
            return obj if cond and cond["status"] == "True" else None

        obj = wait_until(quantized, "the Quantized condition", timeout=120)
        status = obj["status"]["quantization"]
        assert status["state"] == "Succeeded" and status["serving"] is True
        digest = status["hash"]

        # The Job ran to completion under kwok (offline class, GPU limits, fp16 source read-only).
        job = kjson(cluster, "get", "job", status["jobName"], "-n", namespace)
        assert any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"]["conditions"])
        pod_spec = job["spec"]["template"]["spec"]
        assert pod_spec["priorityClassName"] == "chattts-offline"
        assert pod_spec["containers"][0]["resources"]["limits"][GPU_MEMORY] == "8192"
        assert pod_spec["containers"][0]["args"][:2] == ["quantize", "--model"]

        def switched() -> dict[str, Any] | None:
            dep = kjson(cluster, "get", "deployment", "tts", "-n", namespace)
            volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
            claims = [v for v in volumes.values() if (v.get("persistentVolumeClaim") or {}).get("claimName") == "weights-rw"]
            return dep if claims else None

        dep = wait_until(switched, "the Deployment to mount the quantized weights", timeout=60)
        pod = dep["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if (v.get("persistentVolumeClaim") or {}).get("claimName") == "weights-rw")
        assert volume["persistentVolumeClaim"]["readOnly"] is True
        mounts = [m for c in pod["containers"] for m in c.get("volumeMounts", []) if m["name"] == volume["name"]]
        assert mounts and all(m.get("readOnly") is True for m in mounts)
        assert all(m.get("subPath") == f"awq/{digest}" for m in mounts)
        assert not any((v.get("persistentVolumeClaim") or {}).get("claimName") == "weights" for v in pod["volumes"])
        config = yaml.safe_load(runtime_yaml(cluster.kubectl, namespace, "tts"))
        assert config["model"]["format"] == "awq"
        reasons = {e["reason"] for e in kjson(cluster, "get", "events", "-n", namespace,
                                              "--field-selector", "involvedObject.name=tts")["items"]}
        assert {"QuantizationStarted", "Quantized"} <= reasons
    finally:
        cluster.kubectl("delete", "pv", "-l", f"chattts.io/test={namespace}", "--wait=false", check=False)


# --- bad input ----------------------------------------------------------------------------------

BAD_POLICIES = [
    ("shares-over-100", {"windows": [{"name": "day", "start": "08:00", "end": "20:00", "online": 80, "offline": 30}]},
     "online + offline may not exceed 100"),
    ("start-equals-end", {"windows": [{"name": "day", "start": "08:00", "end": "08:00", "online": 80, "offline": 20}]},
     "a window's start and end must differ"),
    ("duplicate-names", {"windows": [{"name": "day", "start": "08:00", "end": "12:00", "online": 80, "offline": 20},
                                     {"name": "day", "start": "13:00", "end": "14:00", "online": 80, "offline": 20}]},
     "window names must be unique"),
    ("bad-time", {"windows": [{"name": "day", "start": "8am", "end": "20:00", "online": 80, "offline": 20}]},
     "spec.windows[0].start"),
    ("bad-weekday", {"windows": [{"name": "day", "start": "08:00", "end": "20:00", "days": ["Monday"],
                                  "online": 80, "offline": 20}]}, "Unsupported value: \"Monday\""),
    ("default-over-100", {"defaultShares": {"online": 90, "offline": 20}}, "online + offline may not exceed 100"),
    ("in-without-values", {"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In"}]}},
     "selector operators In and NotIn need values"),
    ("unknown-overlap", {"overlap": "Random"}, "Unsupported value: \"Random\""),
]


@pytest.mark.parametrize("case, spec, message", BAD_POLICIES, ids=[b[0] for b in BAD_POLICIES])
def test_bad_policies_are_rejected_at_apply_time(cluster, case, spec, message):
    install_crds(cluster)
    body = {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy", "metadata": {"name": f"bad-{case}"},
            "spec": {"nodeSelector": {}, **spec}}
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0, f"{case} was accepted"
    assert message in result.stderr, result.stderr


def test_an_unknown_timezone_is_reported_in_status(cluster, namespace, operator):
    # The CRD can check the shape of a zone name, not whether the zone exists: the operator says so.
    name = f"tz-{namespace}"[:63]
    body = {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {POOL_KEY: namespace}}, "timezone": "Mars/Olympus_Mons"}}
    try:
        apply(cluster, None, body)

        def reported() -> dict[str, Any] | None:
            obj = kjson(cluster, "get", "gpusharepolicy", name)
            cond = next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Valid"), None)
            return cond if cond and cond["status"] == "False" else None

        cond = wait_until(reported, "the Valid=False condition", timeout=60)
        assert cond["reason"] == "InvalidSpec" and "unknown timezone 'Mars/Olympus_Mons'" in cond["message"]
    finally:
        cluster.kubectl("delete", "gpusharepolicy", name, "--ignore-not-found", "--wait=false", check=False)


# --- preemption ---------------------------------------------------------------------------------


def test_online_pods_preempt_offline_pods_that_hold_the_gpus(cluster, namespace, gpu_pool, operator):
    """Offline work outside the policy's control fills the pool; the policy's online member
    still gets its replicas, because its pods run in the online PriorityClass."""
    policy_name = f"pre-{namespace}"[:63]
    filler = offline_job("filler", policy_name, gpu_pool, 0)
    filler["metadata"]["labels"] = {}  # not a member: nothing suspends it
    filler["spec"].update(suspend=False, parallelism=5, completions=5)
    try:
        apply(cluster, namespace, filler)
        wait_until(lambda: sum(1 for p in kjson(cluster, "get", "pods", "-n", namespace, "-l", "job-name=filler")["items"]
                               if p["status"].get("phase") == "Running") == 5,
                   "5 offline pods filling the pool's 100,000 MiB")
        apply(cluster, None, policy(policy_name, gpu_pool))
        apply(cluster, namespace, serving("tts", policy_name, gpu_pool, replicas=2))

        def served() -> bool:
            pods = kjson(cluster, "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=tts")["items"]
            return sum(1 for p in pods if p["status"].get("phase") == "Running"
                       and not p["metadata"].get("deletionTimestamp")) == 2

        wait_until(served, "2 online replicas running after preempting offline pods", timeout=120)
        dep = kjson(cluster, "get", "deployment", "tts", "-n", namespace)
        assert dep["spec"]["template"]["spec"]["priorityClassName"] == "chattts-online"
        running = [p for p in kjson(cluster, "get", "pods", "-n", namespace, "-l", "job-name=filler")["items"]
                   if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
        assert len(running) <= 4
        reasons = {e["reason"] for e in kjson(cluster, "get", "events", "-n", namespace)["items"]}
        assert "Preempted" in reasons or "Preempting" in reasons, sorted(reasons)
    finally:
        cluster.kubectl("delete", "gpusharepolicy", policy_name, "--ignore-not-found", "--wait=false", check=False)


def test_leaving_the_policy_releases_the_cap(cluster, namespace, gpu_pool, operator):
    policy_name = f"rel-{namespace}"[:63]

    def cap() -> str | None:
        return (kjson(cluster, "get", "ctd", "tts", "-n", namespace)["metadata"].get("annotations") or {}).get(CAP)

    def deployment_replicas() -> int | None:
        return kjson(cluster, "get", "deployment", "tts", "-n", namespace)["spec"]["replicas"]

    try:
        apply(cluster, None, policy(policy_name, gpu_pool))
        apply(cluster, namespace, serving("tts", policy_name, gpu_pool, replicas=10))
        wait_until(lambda: cap() == "6" and deployment_replicas() == 6, "the night cap of 6 replicas")
        # The label goes: the cap goes with it, and spec.replicas serves again.
        cluster.kubectl("label", "ctd", "tts", "-n", namespace, f"{SHARE_LABEL}-")
        wait_until(lambda: cap() is None and deployment_replicas() == 10, "the cap removed after the label")
        # Back under the policy, then the policy is deleted: released again.
        cluster.kubectl("label", "ctd", "tts", "-n", namespace, f"{SHARE_LABEL}={policy_name}")
        wait_until(lambda: cap() == "6" and deployment_replicas() == 6, "the cap back under the policy")
        cluster.kubectl("delete", "gpusharepolicy", policy_name, "--wait=true", "--timeout=60s")
        wait_until(lambda: cap() is None and deployment_replicas() == 10, "the cap removed with the policy")
        reasons = {e["reason"] for e in kjson(cluster, "get", "events", "-n", namespace,
                                              "--field-selector", "involvedObject.name=tts")["items"]}
        assert "ReplicaCapRemoved" in reasons
    finally:
        cluster.kubectl("delete", "gpusharepolicy", policy_name, "--ignore-not-found", "--wait=false", check=False)


def test_two_policies_over_the_same_nodes(cluster, namespace, gpu_pool, operator):
    first, second = f"a-{namespace}"[:63], f"b-{namespace}"[:63]
    try:
        apply(cluster, None, policy(first, gpu_pool), policy(second, gpu_pool))

        def valid(name: str) -> dict[str, Any] | None:
            obj = kjson(cluster, "get", "gpusharepolicy", name)
            return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Valid"), None)

        yielded = wait_until(lambda: (c := valid(second)) and c["status"] == "False" and c, "the second policy to yield")
        assert yielded["reason"] == "OverlappingPool" and first in yielded["message"]
        # The one that acts is valid, and names the one that yields to it.
        acting = wait_until(lambda: (c := valid(first)) and c["status"] == "True" and second in c["message"] and c,
                            "the first policy to report it")
        assert "yields" in acting["message"]
        for _ in range(3):
            time.sleep(1)
            assert valid(first)["status"] == "True"
        # The second goes: the first is valid again.
        cluster.kubectl("delete", "gpusharepolicy", second, "--wait=true", "--timeout=60s")
        wait_until(lambda: (c := valid(first)) and c["status"] == "True", "the first policy valid again")
    finally:
        cluster.kubectl("delete", "gpusharepolicy", first, second, "--ignore-not-found", "--wait=false", check=False)


# --- accounting that adds up (issue 32) ----------------------------------------------------------


def conditions_of(cluster, name: str) -> dict[str, dict[str, Any]]:
    obj = kjson(cluster, "get", "gpusharepolicy", name)
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}


def test_policy_events_are_recorded(cluster, namespace, gpu_pool, operator):
    """Events about a GPUSharePolicy (cluster-scoped) are posted in namespace default, where the
    API server accepts them, and name the policy."""
    name = f"ev-{namespace}"[:63]
    try:
        apply(cluster, None, policy(name, gpu_pool))
        events = wait_until(lambda: [e for e in kjson(cluster, "get", "events", "-n", "default", "--field-selector",
                                                       f"involvedObject.name={name}")["items"]
                                     if e["reason"] == "WindowChanged"], "the WindowChanged Event", timeout=60)
        event = events[0]
        assert event["involvedObject"]["kind"] == "GPUSharePolicy" and not event["involvedObject"].get("namespace")
        assert "window 'night' in force" in event["message"]
    finally:
        cluster.kubectl("delete", "gpusharepolicy", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_mig_node_is_counted_once(cluster, namespace, operator):
    """The session cluster's MIG node (hack/cluster/nodes.yaml: 8 H200s, each split into slices
    that hold its memory, GFD's gpu.count still 8) counts its slices' memory, once."""
    node = kjson(cluster, "get", "node", "gpu-h200-mig-0")
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    slices = {"1g.18gb": 16, "2g.35gb": 8, "3g.71gb": 8}
    for profile, count in slices.items():
        assert node["status"]["allocatable"][f"nvidia.com/mig-{profile}"] == str(count)
    name = f"mig-{namespace}"[:63]
    body = {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "gpu-h200-mig-0"}}}}
    try:
        apply(cluster, None, body)
        pool = wait_until(lambda: (kjson(cluster, "get", "gpusharepolicy", name).get("status") or {}).get("pool", {})
                          .get("gpuMemoryMiB"), "the pool's GPU memory", timeout=60)
        # Each slice by its profile's memory, as the members' MIG requests are counted; the 8 GPUs
        # GFD counts are not added on top (that was 8 x 143,771 MiB more).
        assert pool == sum(count * mig_profile_memory_mib(profile) for profile, count in slices.items())
        assert pool <= 8 * 143771
    finally:
        cluster.kubectl("delete", "gpusharepolicy", name, "--ignore-not-found", "--wait=false", check=False)


def test_an_empty_pool_is_a_condition_and_changes_nothing(cluster, namespace, operator):
    name = f"empty-{namespace}"[:63]
    body = {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {POOL_KEY: f"nothing-{namespace}"}}}}
    member = {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment",
              "metadata": {"name": "tts", "labels": {SHARE_LABEL: name}},
              "spec": {"replicas": 2, "model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"},
                       "gpu": {"memory": "8Gi"}, "engine": dict(TEST_ENGINE)}}
    try:
        apply(cluster, None, body)
        apply(cluster, namespace, member)
        conditions = wait_until(lambda: (c := conditions_of(cluster, name)) and "Valid" in c and c,
                                "the policy's conditions", timeout=60)
        assert conditions["Valid"]["status"] == "False" and conditions["Valid"]["reason"] == "EmptyPool"
        assert conditions["Balanced"]["status"] == "False" and conditions["Balanced"]["reason"] == "EmptyPool"
        # No budget of 0 scales the member down: it is left alone.
        wait_until(lambda: kjson(cluster, "get", "deployment", "tts", "-n", namespace)["spec"]["replicas"] == 2,
                   "the member's Deployment at spec.replicas", timeout=60)
        time.sleep(2)
        annotations = kjson(cluster, "get", "ctd", "tts", "-n", namespace)["metadata"].get("annotations") or {}
        assert CAP not in annotations
        # An edit is seen at once (no resync wait), and its generation reported.
        cluster.kubectl("patch", "gpusharepolicy", name, "--type=merge", "-p",
                        json.dumps({"spec": {"defaultShares": {"online": 90, "offline": 10}}}))
        wait_until(lambda: (o := kjson(cluster, "get", "gpusharepolicy", name))["status"]["observedGeneration"]
                   == o["metadata"]["generation"], "the new generation observed", timeout=10)
    finally:
        cluster.kubectl("delete", "gpusharepolicy", name, "--ignore-not-found", "--wait=false", check=False)


def test_a_label_naming_no_policy_is_reported(cluster, namespace, operator):
    """A typo in the share-policy label is no silent no-op: the member says the policy does not
    exist, and learns when it appears (the policies' watch, not a resync)."""
    name = f"later-{namespace}"[:63]
    member = {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment",
              "metadata": {"name": "tts", "labels": {SHARE_LABEL: name}},
              "spec": {"replicas": 0, "model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"},
                       "gpu": {"memory": "8Gi"}, "engine": dict(TEST_ENGINE)}}

    def share_condition() -> dict[str, Any]:
        obj = kjson(cluster, "get", "ctd", "tts", "-n", namespace)
        return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "SharePolicy"), {})

    try:
        apply(cluster, namespace, member)
        cond = wait_until(lambda: (c := share_condition()) and c, "the SharePolicy condition", timeout=60)
        assert cond["status"] == "False" and cond["reason"] == "PolicyNotFound" and name in cond["message"]
        apply(cluster, None, {"apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy",
                              "metadata": {"name": name}, "spec": {"nodeSelector": {"matchLabels": {POOL_KEY: "x"}}}})
        wait_until(lambda: share_condition().get("status") == "True", "SharePolicy=True once the policy exists",
                   timeout=30)
        cluster.kubectl("delete", "gpusharepolicy", name, "--wait=true", "--timeout=60s")
        wait_until(lambda: share_condition().get("reason") == "PolicyNotFound", "PolicyNotFound again", timeout=30)
    finally:
        cluster.kubectl("delete", "gpusharepolicy", name, "--ignore-not-found", "--wait=false", check=False)


def test_pods_outside_the_pool_are_reported_then_brought_inside(cluster, namespace, gpu_pool, operator):
    """A member serving on nodes outside the pool when it joins: those pods are not counted
    against the pool and status names them (PodsOutsidePool) for as long as they run there;
    the policy's selector becomes the pods' node affinity, so once they may run in the pool
    (here: once they tolerate its taint) the rollout puts them inside.

    Joining is two template changes, one after the other: the label alone gives the pods the
    online priority class, then the policy's first pass gives them the pool's affinity. The
    first rollout's surge pod may land outside too (3 pods outside for a moment, one on another
    node), so which pods run outside is read once the second rollout has settled."""
    name = f"out-{namespace}"[:63]
    member = serving("tts", name, gpu_pool, replicas=2)
    member["metadata"]["labels"] = {}
    del member["spec"]["gpu"]["nodeSelector"]
    tolerations = member["spec"].pop("tolerations")  # the pool's nodes are tainted: it runs elsewhere

    def serving_pods() -> list[dict[str, Any]]:
        return kjson(cluster, "get", "pods", "-n", namespace, "-l", "app.kubernetes.io/instance=tts")["items"]

    def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]

    def outside_report() -> dict[str, Any]:
        return conditions_of(cluster, name).get("PodsOutsidePool") or {}

    def names_exactly(message: str, pods: list[dict[str, Any]]) -> bool:
        """The condition's message counts and names these pods (namespace/pod on node)."""
        return message.startswith(f"{len(pods)} member pods ") and all(
            f"{namespace}/{p['metadata']['name']} on {p['spec']['nodeName']}" in message for p in pods)

    try:
        apply(cluster, namespace, member)
        outside_nodes = wait_until(lambda: (n := sorted(p["spec"]["nodeName"] for p in running(serving_pods())))
                                   and len(n) == 2 and n, "2 replicas running")
        assert not set(outside_nodes) & set(gpu_pool.nodes)
        apply(cluster, None, policy(name, gpu_pool))
        cluster.kubectl("label", "ctd", "tts", "-n", namespace, f"{SHARE_LABEL}={name}")

        # The affinity came: the new pod waits (the taint), two pods outside keep serving, uncounted.
        def settled_outside() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
            dep = kjson(cluster, "get", "deployment", "tts", "-n", namespace)
            affinity = (dep["spec"]["template"]["spec"].get("affinity") or {}).get("nodeAffinity")
            pods = serving_pods()
            outside = [p for p in running(pods) if p["spec"]["nodeName"] not in gpu_pool.nodes]
            waiting = [p for p in pods if not p["spec"].get("nodeName")]
            rolled = (affinity and dep["status"].get("observedGeneration") == dep["metadata"]["generation"]
                      and dep["status"].get("updatedReplicas") == 1 and dep["status"].get("replicas") == 3)
            if not (rolled and len(pods) == 3 and len(outside) == 2 and len(waiting) == 1):
                return None
            report = outside_report()
            return (dep, outside) if report.get("status") == "True" and names_exactly(report["message"], outside) \
                else None

        dep, outside = wait_until(settled_outside, "the pool's affinity rolled out, PodsOutsidePool naming the "
                                  "2 pods that serve outside", timeout=60)
        assert "not counted" in outside_report()["message"]
        terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert all({"key": POOL_KEY, "operator": "In", "values": [namespace]} in t["matchExpressions"] for t in terms)
        # And so it stays while they serve there: two more passes of the policy say the same.
        def passes() -> float:
            return REGISTRY.get_sample_value("chattts_sharepolicy_passes_total", {"policy": name}) or 0.0

        seen = passes()
        wait_until(lambda: passes() >= seen + 2, "two more passes of the policy", timeout=30)
        report = outside_report()
        assert report["status"] == "True" and names_exactly(report["message"], outside), report
        # The rollout has 3 pods (2 outside): counted are the 2 replicas the cap allows, not 3.
        status = kjson(cluster, "get", "gpusharepolicy", name)["status"]
        assert status["used"]["onlineMiB"] == 2 * REPLICA_MIB, status["used"]

        # Allowed into the pool: the rollout moves them in, the report clears, 2 replicas counted.
        cluster.kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge",
                        "-p", json.dumps({"spec": {"tolerations": tolerations}}))

        def inside() -> bool:
            pods = serving_pods()
            now = [p["spec"].get("nodeName") for p in running(pods)]
            status = kjson(cluster, "get", "gpusharepolicy", name)["status"]
            reported = next((c for c in status.get("conditions", []) if c["type"] == "PodsOutsidePool"), {})
            # Counted from the Deployment too (its status.replicas until it sees the old pods gone).
            return (len(pods) == 2 and len(now) == 2 and set(now) <= set(gpu_pool.nodes)
                    and reported.get("reason") == "AllInPool" and status["used"]["onlineMiB"] == 2 * REPLICA_MIB)

        wait_until(inside, "the member's pods inside the pool, 2 replicas counted", timeout=120)
    finally:
        cluster.kubectl("delete", "gpusharepolicy", name, "--ignore-not-found", "--wait=false", check=False)


def test_the_examples_are_accepted_by_the_api_server(cluster, namespace):
    install_crds(cluster)
    examples = REPO / "deploy" / "examples"
    for path in sorted(examples.glob("gpusharepolicy*.yaml")):
        scope = [] if yaml.safe_load(path.read_text())["kind"] == "GPUSharePolicy" else ["-n", namespace]
        result = cluster.kubectl("apply", "--dry-run=server", *scope, "-f", str(path), check=False)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"
