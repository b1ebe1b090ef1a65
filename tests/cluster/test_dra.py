"""The dra GPU sharing profile on the real scheduler (Dynamic Resource Allocation, GPU memory
as consumable capacity, KEP-5075).

Each test brings its own simulated GPU node (test_rebalancing's private pool: tainted, run by
a private kwok) and publishes that node's ResourceSlice with hack/cluster/draslices.py, so it
knows exactly which devices exist. The operator runs in this process (test_rebalancing's
fixture). What is real: the API objects, kube-scheduler's allocation of the claims, the claim
controller making one claim per pod from the operator's ResourceClaimTemplate, Deployment
rollouts. What is simulated: the GPUs (no kubelet plugin prepares a claim; kwok marks a
bound pod Running).
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any, Iterator

import pytest

import draslices
import gpunodes
from chattts_operator.api.common import parse_live_quantity
from tests.cluster import test_rebalancing as rebalancing
from tests.cluster.test_rebalancing import GpuPool, apply, expect, kjson, policy
from tests.support import TEST_ENGINE, wait_until

# test_rebalancing's fixtures: the in-process operator, its manual clock, the private GPU pool.
operator, manual_clock, gpu_pool = rebalancing.operator, rebalancing.manual_clock, rebalancing.gpu_pool

MIB = 2**20
SHARE_LABEL = "tts.chattts.io/share-policy"


class DraPool:
    """A private GPU node with the given devices in its ResourceSlice."""

    def __init__(self, pool: GpuPool) -> None:
        self.pool = pool
        self.slices: list[str] = []

    def add_node(self, *device_mib: int) -> str:
        node = self.pool.add_node()
        gpus = [draslices.SimulatedGpu(name=f"gpu-{i}", uuid=f"GPU-{node}-{i}", product="NVIDIA TEST",
                                       architecture="Hopper", compute="9.0.0", memory_mib=mib)
                for i, mib in enumerate(device_mib)]
        manifest = draslices.resource_slice(node, gpus)
        draslices.apply(self.pool.cluster.api, [manifest])
        self.slices.append(manifest["metadata"]["name"])
        return node

    def close(self) -> None:
        for name in self.slices:
            self.pool.cluster.kubectl("delete", "resourceslice", name, "--ignore-not-found", "--wait=false",
                                      check=False)


@pytest.fixture
def dra_pool(cluster, gpu_pool) -> Iterator[DraPool]:
    # The simulated DeviceClass of hack/cluster (the session cluster may predate it).
    draslices.apply(cluster.api, [draslices.device_class()])
    # gpu_pool made one node with extended resources only; a DRA test adds its own.
    pool = DraPool(gpu_pool)
    try:
        yield pool
    finally:
        pool.close()


def serving(name: str, pool: GpuPool | None, memory: str, replicas: int, profile: str = "dra",
            labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A ChatTTSDeployment on the private pool's node (None: on the session cluster's nodes)."""
    obj: dict[str, Any] = {
        "apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "replicas": replicas,
            "model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"},
            "gpu": {"memory": memory, "profile": profile},
            "engine": dict(TEST_ENGINE),  # the graph engine's caches fit 8Gi (and 9000Mi) at this length
        },
    }
    if pool is not None:
        placement = pool.pod_placement()
        obj["spec"]["gpu"]["nodeSelector"] = placement["nodeSelector"]
        obj["spec"]["tolerations"] = placement["tolerations"]
    return obj


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def ready_and_allocated(cluster, namespace: str, name: str, replicas: int) -> dict[str, Any] | None:
    obj = kjson(cluster, "get", "ctd", name, "-n", namespace)
    st = obj.get("status") or {}
    dra = (st.get("gpu") or {}).get("dra") or {}
    ok = (st.get("phase") == "Ready" and st.get("readyReplicas") == replicas
          and condition(obj, "GPUAllocated").get("status") == "True" and dra.get("allocatedClaims") == replicas)
    return obj if ok else None


def consumed_per_device(cluster, namespace: str | None = None) -> dict[tuple[str, str], int]:
    """MiB consumed on each device, summed over every allocated claim, read from the claims."""
    scope = ["-n", namespace] if namespace else ["-A"]
    used: dict[tuple[str, str], int] = {}
    for claim in kjson(cluster, "get", "resourceclaims", *scope)["items"]:
        for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results", []):
            key = (result["pool"], result["device"])
            used[key] = used.get(key, 0) + int(parse_live_quantity(result["consumedCapacity"]["memory"]) / MIB)
    return used


def serving_pods(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return kjson(cluster, "get", "pods", "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")["items"]


# --- the tests -------------------------------------------------------------------------------------


def test_the_simulated_slices_are_what_nvidias_driver_publishes_for_the_nodes_file():
    specs = gpunodes.load_nodes()
    objects = draslices.manifests(specs)
    assert objects[0]["kind"] == "DeviceClass" and objects[0]["metadata"]["name"] == "gpu.nvidia.com"
    slices = {o["spec"]["nodeName"]: o for o in objects[1:]}
    assert set(slices) == {s.name for s in specs if not s.flavour.mig_strategy}  # MIG nodes: no slice
    h200 = slices["gpu-h200-0"]["spec"]
    assert h200["driver"] == "gpu.nvidia.com" and h200["pool"] == {"name": "gpu-h200-0", "generation": 1,
                                                                   "resourceSliceCount": 1}
    first = h200["devices"][0]
    assert [d["name"] for d in h200["devices"]] == [f"gpu-{i}" for i in range(8)]
    assert first["attributes"]["productName"] == {"string": "NVIDIA H200"}
    assert first["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert {"type", "uuid", "brand", "architecture", "driverVersion", "cudaDriverVersion"} <= set(first["attributes"])
    assert first["capacity"]["memory"]["value"] == "143771Mi" and first["allowMultipleAllocations"] is True
    assert first["capacity"]["memory"]["requestPolicy"]["validRange"] == {"min": "1Mi", "max": "143771Mi",
                                                                          "step": "1Mi"}
    assert len({d["attributes"]["uuid"]["string"] for o in objects[1:] for d in o["spec"]["devices"]}) == 32
    assert draslices.nvml_product("NVIDIA-A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"


def test_the_local_cluster_serves_the_simulated_gpus(cluster):
    """localcluster.py published them at start; the API server accepted every field."""
    live = {s["spec"]["nodeName"]: s for s in kjson(cluster, "get", "resourceslices")["items"]
            if s["spec"]["driver"] == "gpu.nvidia.com" and s["metadata"]["name"].startswith("gpu-")}
    for want in draslices.manifests(gpunodes.load_nodes())[1:]:
        have = live[want["spec"]["nodeName"]]["spec"]
        assert [d["name"] for d in have["devices"]] == [d["name"] for d in want["spec"]["devices"]]
        assert all(d.get("allowMultipleAllocations") for d in have["devices"]), "consumable capacity dropped"
        assert all("requestPolicy" in d["capacity"]["memory"] for d in have["devices"])
    assert kjson(cluster, "get", "deviceclass", "gpu.nvidia.com")["spec"]["selectors"]


def test_two_deployments_share_one_gpu_and_the_third_waits_with_the_schedulers_reason(
        cluster, namespace, dra_pool, operator):
    node = dra_pool.add_node(40_000)  # one GPU: two 16Gi replicas fit, a third does not
    apply(cluster, namespace, serving("tts-a", dra_pool.pool, "16Gi", 1), serving("tts-b", dra_pool.pool, "16Gi", 1))
    for name in ("tts-a", "tts-b"):
        obj = wait_until(lambda: ready_and_allocated(cluster, namespace, name, 1), f"{name} Ready, claim allocated")
        dra = obj["status"]["gpu"]["dra"]
        assert dra["devices"] == [{"claim": dra["devices"][0]["claim"], "pool": node, "device": "gpu-0",
                                   "memoryMiB": 16_384}], dra
        assert dra["allocatedMemoryMiB"] == 16_384 and dra["deviceClass"] == "gpu.nvidia.com"
        assert obj["status"]["gpu"]["profile"] == "dra" and obj["status"]["gpu"]["limits"] == {}
        template = kjson(cluster, "get", "resourceclaimtemplate", dra["resourceClaimTemplate"], "-n", namespace)
        request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        assert request["capacity"] == {"requests": {"memory": "16Gi"}} and request["count"] == 1, request
        assert template["metadata"]["ownerReferences"][0]["name"] == name
        pods = serving_pods(cluster, namespace, name)
        assert [p["status"]["phase"] for p in pods] == ["Running"] and pods[0]["spec"]["nodeName"] == node
        assert "nvidia.com/gpu.memory" not in pods[0]["spec"]["containers"][0]["resources"].get("limits", {})
    assert consumed_per_device(cluster, namespace) == {(node, "gpu-0"): 32_768}

    apply(cluster, namespace, serving("tts-c", dra_pool.pool, "16Gi", 1))

    def waiting() -> dict[str, Any] | None:
        obj = kjson(cluster, "get", "ctd", "tts-c", "-n", namespace)
        allocated = condition(obj, "GPUAllocated")
        return obj if allocated.get("status") == "False" and allocated.get("reason") == "Unschedulable" else None

    obj = wait_until(waiting, "tts-c GPUAllocated=False with the scheduler's reason")
    message = condition(obj, "GPUAllocated")["message"]
    # The scheduler's own words (the DRA plugin's "cannot allocate all claims").
    assert "cannot allocate all claims" in message, message
    assert obj["status"]["phase"] != "Ready" and obj["status"]["gpu"]["dra"]["allocatedClaims"] == 0
    assert [p["status"]["phase"] for p in serving_pods(cluster, namespace, "tts-c")] == ["Pending"]
    assert consumed_per_device(cluster, namespace) == {(node, "gpu-0"): 32_768}
    # Events carry it too (a Warning on the ChatTTSDeployment).
    reasons = {e["reason"] for e in kjson(cluster, "get", "events", "-n", namespace, "--field-selector",
                                          "involvedObject.name=tts-c")["items"]}
    assert "GPUAllocatedFalse" in reasons, reasons


def test_the_schedulers_reason_arrives_without_waiting_for_a_resync(cluster, namespace, dra_pool, operators):
    """The scheduler's reason reaches status within seconds, not at the next resync (ten minutes
    here). Measured: the Deployment's own status updates after the pod's creation usually bring
    it; a dra object whose claims still wait is also looked at again every 10 s
    (DRA_PENDING_RECHECK_SECONDS), which this test does not single out."""
    dra_pool.add_node(20_000)
    op = operators(resync_interval_seconds="600").start()
    apply(cluster, namespace, serving("fits", dra_pool.pool, "16Gi", 1))
    wait_until(lambda: ready_and_allocated(cluster, namespace, "fits", 1), "the first one Ready")
    apply(cluster, namespace, serving("waits", dra_pool.pool, "16Gi", 1))
    started = time.monotonic()
    wait_until(lambda: condition(kjson(cluster, "get", "ctd", "waits", "-n", namespace), "GPUAllocated").get(
        "reason") == "Unschedulable", "the scheduler's reason in status", timeout=90)
    assert time.monotonic() - started < 90 and op.running()


def test_the_scheduler_never_overcommits_a_gpu(cluster, namespace, dra_pool, operator):
    node = dra_pool.add_node(40_000, 30_000)  # 4 x 9000 fit on gpu-0, 3 on gpu-1: 7 of 9
    apply(cluster, namespace, serving("tts", dra_pool.pool, "9000Mi", 9))

    def settled() -> list[dict[str, Any]] | None:
        pods = serving_pods(cluster, namespace, "tts")
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return pods if len(pods) == 9 and len(running) == 7 else None

    wait_until(settled, "7 of 9 replicas Running")
    time.sleep(3)  # and it stays so: the other two wait for memory that is not there
    pods = serving_pods(cluster, namespace, "tts")
    assert sorted(p["status"]["phase"] for p in pods) == ["Pending"] * 2 + ["Running"] * 7
    capacity = {(node, d["name"]): int(parse_live_quantity(d["capacity"]["memory"]["value"]) / MIB)
                for d in kjson(cluster, "get", "resourceslice", f"{node}-gpu.nvidia.com")["spec"]["devices"]}
    used = consumed_per_device(cluster, namespace)
    assert used == {(node, "gpu-0"): 36_000, (node, "gpu-1"): 27_000}, used
    assert all(used[key] <= capacity[key] for key in used), (used, capacity)
    obj = kjson(cluster, "get", "ctd", "tts", "-n", namespace)
    assert obj["status"]["gpu"]["dra"]["claims"] == 9 and obj["status"]["gpu"]["dra"]["allocatedClaims"] == 7

    # Fewer replicas: the waiting pods go, every claim left is allocated.
    cluster.kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":7}}')
    wait_until(lambda: ready_and_allocated(cluster, namespace, "tts", 7), "7 replicas Ready, every claim allocated")


def test_a_spec_that_cannot_start_keeps_the_claim_template_its_pods_use(cluster, namespace, dra_pool, operator):
    dra_pool.add_node(40_000)
    apply(cluster, namespace, serving("tts", dra_pool.pool, "16Gi", 1))
    obj = wait_until(lambda: ready_and_allocated(cluster, namespace, "tts", 1), "Ready, claim allocated")
    template = obj["status"]["gpu"]["dra"]["resourceClaimTemplate"]
    # Too little GPU memory for the model's plan: the new generation is blocked, the old one serves.
    cluster.kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p", '{"spec":{"gpu":{"memory":"1Gi"}}}')
    wait_until(lambda: kjson(cluster, "get", "ctd", "tts", "-n", namespace)["status"].get("phase") == "Degraded",
               "the blocked generation reported")
    time.sleep(5)  # a few resyncs (every 2 s here)
    names = [t["metadata"]["name"] for t in kjson(cluster, "get", "resourceclaimtemplates", "-n", namespace)["items"]]
    assert names == [template], names
    pods = serving_pods(cluster, namespace, "tts")
    assert [p["status"]["phase"] for p in pods] == ["Running"] and consumed_per_device(cluster, namespace)


def test_the_example_runs_on_the_simulated_h200s(cluster, namespace, operator):
    """deploy/examples/chattts-dra.yaml on the session cluster's own slices (hack/cluster)."""
    cluster.kubectl("apply", "-n", namespace, "-f", str(rebalancing.REPO / "deploy" / "examples" / "chattts-dra.yaml"))
    obj = wait_until(lambda: ready_and_allocated(cluster, namespace, "chattts-dra", 2), "the example Ready, allocated")
    devices = obj["status"]["gpu"]["dra"]["devices"]
    assert len(devices) == 2 and all(d["pool"].startswith("gpu-h200-") and d["memoryMiB"] == 16_384 for d in devices)
    assert obj["status"]["gpuShare"] == "1x16Gi dra"
    printed = cluster.kubectl("get", "ctd", "-n", namespace).stdout
    assert "1x16Gi dra" in printed and "Ready" in printed


def test_the_quantization_job_claims_its_gpu_through_its_own_template(cluster, namespace, operator):
    """With the dra profile the AWQ Job's pod asks its GPU through a claim as well (its own
    template: its claims are not counted as the serving pods'); the scheduler places it only
    once the claim is allocated, and kwok completes it."""
    rebalancing.static_pvc(cluster, namespace, "weights", "/srv/chattts")
    rebalancing.static_pvc(cluster, namespace, "weights-rw", "/srv/chattts-awq")
    apply(cluster, namespace, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "calib"},
                               "data": {"texts.jsonl": '{"text": "hello"}\n'}})
    ctd = serving("tts", None, "8Gi", 1)
    ctd["spec"]["model"] = {"pvc": {"claimName": "weights", "subPath": "chattts-fp16"}, "format": "fp16"}
    ctd["spec"]["quantization"] = {"calibration": {"configMap": {"name": "calib", "key": "texts.jsonl"}},
                                   "output": {"claimName": "weights-rw", "subPath": "awq"}, "gpuMemory": "12Gi"}
    apply(cluster, namespace, ctd)

    def quantized() -> dict[str, Any] | None:
        obj = kjson(cluster, "get", "ctd", "tts", "-n", namespace)
        return obj if condition(obj, "Quantized").get("status") == "True" else None

    obj = wait_until(quantized, "the Quantized condition", timeout=120)
    job = kjson(cluster, "get", "job", obj["status"]["quantization"]["jobName"], "-n", namespace)
    pod_spec = job["spec"]["template"]["spec"]
    (ref,) = pod_spec["resourceClaims"]
    assert pod_spec["containers"][0]["resources"]["claims"] == [{"name": ref["name"]}]
    template = kjson(cluster, "get", "resourceclaimtemplate", ref["resourceClaimTemplateName"], "-n", namespace)
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request["capacity"] == {"requests": {"memory": "12Gi"}}
    assert template["spec"]["metadata"]["labels"]["app.kubernetes.io/component"] == "quantize"
    (pod,) = kjson(cluster, "get", "pods", "-n", namespace, "-l", f"job-name={job['metadata']['name']}")["items"]
    assert pod["spec"]["nodeName"].startswith(("gpu-h200-", "gpu-a100-")) and pod["status"]["phase"] == "Succeeded"
    # Serving claims only in the ChatTTSDeployment's status; its template is kept, the Job's too.
    obj = wait_until(lambda: ready_and_allocated(cluster, namespace, "tts", 1), "serving Ready on the AWQ weights")
    assert obj["status"]["gpu"]["dra"]["claims"] == 1
    names = {t["metadata"]["name"] for t in kjson(cluster, "get", "resourceclaimtemplates", "-n", namespace)["items"]}
    assert ref["resourceClaimTemplateName"] in names and obj["status"]["gpu"]["dra"]["resourceClaimTemplate"] in names


class ReadySampler(threading.Thread):
    """The fewest Ready serving pods seen while it runs."""

    def __init__(self, cluster, namespace: str, name: str) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.stop_event = threading.Event()
        self.fewest: int | None = None
        self.samples = 0

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                pods = serving_pods(self.cluster, self.namespace, self.name)
            except Exception:  # noqa: BLE001 - a failed read is only a lost sample
                continue
            ready = sum(1 for p in pods if not p["metadata"].get("deletionTimestamp") and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))
            self.fewest = ready if self.fewest is None else min(self.fewest, ready)
            self.samples += 1

    def stop(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)


def test_switching_between_gpu_memory_and_dra_keeps_the_pdb(cluster, namespace, dra_pool, operator):
    dra_pool.add_node(50_000, 50_000)  # the node's extended resources: 100,000 MiB gpu.memory
    replicas = 3
    apply(cluster, namespace, serving("tts", dra_pool.pool, "10Gi", replicas, profile="gpu-memory"))
    wait_until(lambda: kjson(cluster, "get", "ctd", "tts", "-n", namespace)["status"].get("readyReplicas") == replicas,
               "3 replicas Ready on gpu-memory")
    pdb = kjson(cluster, "get", "pdb", "tts", "-n", namespace)
    allowed_down = pdb["spec"]["maxUnavailable"]

    for profile in ("dra", "gpu-memory"):
        sampler = ReadySampler(cluster, namespace, "tts")
        sampler.start()
        try:
            cluster.kubectl("patch", "ctd", "tts", "-n", namespace, "--type=merge", "-p",
                            f'{{"spec":{{"gpu":{{"profile":"{profile}"}}}}}}')

            def rolled() -> bool:
                obj = kjson(cluster, "get", "ctd", "tts", "-n", namespace)
                pods = [p for p in serving_pods(cluster, namespace, "tts") if not p["metadata"].get("deletionTimestamp")]
                on_claims = [bool(p["spec"].get("resourceClaims")) for p in pods]
                st = obj["status"]
                return (st.get("appliedGeneration") == obj["metadata"]["generation"] and st.get("phase") == "Ready"
                        and st["gpu"]["profile"] == profile and len(pods) == replicas
                        and all(flag == (profile == "dra") for flag in on_claims))

            wait_until(rolled, f"rolled out to {profile}", timeout=180)
        finally:
            sampler.stop()
        assert sampler.samples >= 5, sampler.samples
        assert sampler.fewest is not None and sampler.fewest >= replicas - allowed_down, \
            f"{profile}: only {sampler.fewest} Ready pods at one point (PDB allows {allowed_down} down)"

    # Back on extended resources: the operator deleted its claim template, status dropped the claims.
    wait_until(lambda: not kjson(cluster, "get", "resourceclaimtemplates", "-n", namespace)["items"],
               "the stale ResourceClaimTemplate deleted")
    obj = kjson(cluster, "get", "ctd", "tts", "-n", namespace)
    assert obj["status"]["gpu"].get("dra") is None and condition(obj, "GPUAllocated") == {}


def test_a_window_change_suspends_and_resumes_jobs_with_dra_members(cluster, namespace, dra_pool, operator,
                                                                    manual_clock):
    """Night (60/40 of 100,000 MiB): 4 dra replicas of 10,000 MiB and both dra Jobs of 20,000;
    day (80/20): the lower-priority Job is suspended; night again: resumed. What the policy
    counts comes from the claims (status.used equals what the claims hold)."""
    pool = dra_pool.pool
    pool.nodes.clear()  # the fixture's node has no slice: this test's pool is the DRA node alone
    cluster.kubectl("delete", "node", f"{namespace}-gpu-0"[:63], "--ignore-not-found")
    node = dra_pool.add_node(50_000, 50_000)
    policy_name = f"pool-{namespace}"[:63]
    job_template = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "batch-gpu"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"memory": "20000Mi"}}}}]}}},
    }

    def job(name: str, priority: int) -> dict[str, Any]:
        return {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {SHARE_LABEL: policy_name},
                         "annotations": {"tts.chattts.io/offline-priority": str(priority)}},
            "spec": {"suspend": True, "parallelism": 1, "completions": 1, "backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "priorityClassName": "chattts-offline", **pool.pod_placement(),
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "batch-gpu"}],
                "containers": [{"name": "work", "image": "registry.invalid/batch:1",
                                "resources": {"claims": [{"name": "gpu"}]}}]}}},
        }

    try:
        apply(cluster, None, policy(policy_name, pool))
        apply(cluster, namespace, job_template,
              serving("tts", pool, "10000Mi", 4, labels={SHARE_LABEL: policy_name}),
              job("replay-high", 9), job("synth-low", 1))
        # expect() checks status.used == replicas x 10,000 + jobs x 20,000 (test_rebalancing's sizes).
        night = expect(cluster, namespace, "tts", policy_name, window="night", replicas=4,
                       jobs=["replay-high", "synth-low"])
        assert night["status"]["pool"] == {"nodes": 1, "gpuMemoryMiB": 100_000}
        assert sum(consumed_per_device(cluster, namespace).values()) == 80_000

        manual_clock.set(datetime(2026, 6, 1, 8, 0, tzinfo=timezone.utc))
        expect(cluster, namespace, "tts", policy_name, window="day", replicas=4, jobs=["replay-high"])
        wait_until(lambda: sum(consumed_per_device(cluster, namespace).values()) == 60_000,
                   "the suspended Job's claim released")

        manual_clock.set(datetime(2026, 6, 1, 20, 0, tzinfo=timezone.utc))
        expect(cluster, namespace, "tts", policy_name, window="night", replicas=4, jobs=["replay-high", "synth-low"])
        used = consumed_per_device(cluster, namespace)
        assert sum(used.values()) == 80_000 and all(mib <= 50_000 for mib in used.values()), used
        assert {key[0] for key in used} == {node}
    finally:
        cluster.kubectl("delete", "gpusharepolicy", policy_name, "--ignore-not-found", "--wait=false", check=False)
