"""The dra profile's codec, pure: the claim template one replica asks, and claims -> MiB (the
share policy's and status's direction), each pod counted once whatever its profile."""
from __future__ import annotations

from typing import Any

from chattts_operator.api.chattts import ChatTTSDeploymentSpec, GpuSpec
from chattts_operator.api.quantization import PvcDirectory, QuantizationSpec
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.children import resource_claim_template_name
from chattts_operator.deployment.gpu import DEFAULT_GPU_CODEC, assign_gpu, dra_allocation_status
from chattts_operator.quantization.plan import JobPlacement, build_quantization_job
from chattts_operator.deployment.spec import desired_state, parse_spec
from chattts_operator.sharepolicy.observe import Claims, offline_member, online_member, pod_memory_mib

SETTINGS = OperatorSettings()
H200_MIB = 143_771


def body(gpu: dict[str, Any], replicas: int = 2) -> dict[str, Any]:
    return {"metadata": {"name": "tts", "namespace": "ns", "uid": "u-1", "generation": 1},
            "spec": {"replicas": replicas, "model": {"hostPath": {"path": "/m"}, "format": "fp16"}, "gpu": gpu,
                     "engine": {"maxModelLen": 1024}}}  # the graph engine fits 16Gi at 64 x 1024


def test_dra_asks_one_device_per_rank_with_memory_as_capacity():
    gpu = assign_gpu(GpuSpec(memory="16Gi", count=2, profile="dra", product="NVIDIA-H200"), SETTINGS)
    assert gpu.limits == {} and gpu.node_min_gpu_memory_mib is None and gpu.share == "2x16Gi dra"
    request = gpu.dra.claim_spec()["devices"]
    exactly = request["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "gpu.nvidia.com" and exactly["count"] == 2
    assert exactly["capacity"] == {"requests": {"memory": "16384Mi"}}
    rules = [s["cel"]["expression"] for s in exactly["selectors"]]
    assert "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('16384Mi')) >= 0" in rules
    assert any("productName" in r and "'NVIDIA-H200'" in r for r in rules)
    # Two ranks of one replica never share a device.
    assert request["constraints"] == [{"requests": ["gpu"], "distinctAttribute": "gpu.nvidia.com/uuid"}]


def test_whole_devices_when_consumable_capacity_is_off():
    settings = OperatorSettings(dra_consumable_capacity=False, dra_device_class="gpu.example.com")
    exactly = assign_gpu(GpuSpec(memory="40Gi", profile="dra"), settings).dra.claim_spec()["devices"]["requests"][0]
    assert "capacity" not in exactly["exactly"] and exactly["exactly"]["deviceClassName"] == "gpu.example.com"


def test_desired_children_reference_the_template_and_a_new_request_gets_a_new_name():
    small = desired_state(body({"memory": "16Gi", "profile": "dra"}), parse_spec(body({"memory": "16Gi", "profile": "dra"})),
                          SETTINGS, largest_node_gpu_mib=None)
    kinds = [c["kind"] for c in small.children()]
    assert kinds.index("ResourceClaimTemplate") < kinds.index("Deployment")
    pod = small.deployment["spec"]["template"]["spec"]
    name = small.resource_claim_template["metadata"]["name"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": name}]
    assert pod["containers"][0]["resources"]["claims"] == [{"name": "gpu"}] and "affinity" not in pod
    # The claims Kubernetes makes carry the serving pods' labels.
    assert small.resource_claim_template["spec"]["metadata"]["labels"]["app.kubernetes.io/instance"] == "tts"
    bigger = assign_gpu(ChatTTSDeploymentSpec.model_validate(body({"memory": "20Gi", "profile": "dra"})["spec"]).gpu,
                        SETTINGS)
    assert resource_claim_template_name("tts", bigger.dra) != name
    other = desired_state(body({"memory": "16Gi"}), parse_spec(body({"memory": "16Gi"})), SETTINGS,
                          largest_node_gpu_mib=None)
    assert other.resource_claim_template is None and "resourceClaims" not in other.deployment["spec"]["template"]["spec"]


def claim(name: str, request_mib: int | None, consumed_mib: int | None = None, device: str = "gpu-0",
          allocated: bool = True) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": 1}
    if request_mib is not None:
        exactly["capacity"] = {"requests": {"memory": f"{request_mib}Mi"}}
    out: dict[str, Any] = {"metadata": {"name": name}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}
    if allocated:
        result = {"driver": "gpu.nvidia.com", "pool": "node-a", "device": device, "request": "gpu"}
        if consumed_mib is not None:
            # The API server writes what the scheduler consumed in canonical form.
            result["consumedCapacity"] = {"memory": f"{consumed_mib // 1024}Gi" if consumed_mib % 1024 == 0
                                          else str(consumed_mib * 2**20)}
        out["status"] = {"allocation": {"devices": {"results": [result]}}}
    return out


def test_claims_count_what_their_allocation_consumed_or_what_they_ask():
    assert DEFAULT_GPU_CODEC.claim_memory_mib(claim("a", 16_384, 16_384), H200_MIB) == 16_384
    assert DEFAULT_GPU_CODEC.claim_memory_mib(claim("b", 9_000, 9_000), H200_MIB) == 9_000
    assert DEFAULT_GPU_CODEC.claim_memory_mib(claim("c", 9_000, allocated=False), H200_MIB) == 9_000
    # Allocated whole (no consumable capacity): the whole GPU.
    assert DEFAULT_GPU_CODEC.claim_memory_mib(claim("d", None, None), H200_MIB) == H200_MIB
    status = dra_allocation_status("t", "gpu.nvidia.com", [claim("a", 16_384, 16_384), claim("c", 9_000, allocated=False)],
                                   DEFAULT_GPU_CODEC, 16_384)
    assert status["claims"] == 2 and status["allocatedClaims"] == 1 and status["allocatedMemoryMiB"] == 16_384
    assert status["devices"] == [{"claim": "a", "pool": "node-a", "device": "gpu-0", "memoryMiB": 16_384}]


def pod(name: str, *, claim_name: str | None = None, template: str | None = None, limits: dict[str, str] | None = None,
        phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": limits or {}}}]}
    status: dict[str, Any] = {"phase": phase}
    if template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
        if claim_name:
            status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    elif claim_name:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim_name}]
    return {"metadata": {"name": name}, "spec": spec, "status": status}


CTD = {"metadata": {"name": "tts", "namespace": "ns"}, "spec": {"replicas": 3, "gpu": {"memory": "10000Mi"}},
       "status": {"gpu": {"limits": {"nvidia.com/gpu.memory": "10000"}}}}


def test_a_mixed_pool_counts_each_pod_once_by_what_it_asked():
    """A rollout from gpu-memory to dra: old pods on extended resources, new ones on claims
    that consumed more; a claim shared by two pods counts once."""
    template = {"metadata": {"name": "tts-gpu"}, "spec": {"spec": claim("x", 12_000)["spec"]}}
    claims = Claims.of([claim("tts-0-gpu", 12_000, 12_000), claim("shared", 12_000, 12_000)], [template])
    pods = [pod("old", limits={"nvidia.com/gpu.memory": "10000"}),
            pod("new", claim_name="tts-0-gpu", template="tts-gpu"),
            pod("waiting", template="tts-gpu"),  # its claim not made yet: the template's request
            pod("s1", claim_name="shared"), pod("s2", claim_name="shared")]
    counted: set[str] = set()
    held = [pod_memory_mib(p, H200_MIB, DEFAULT_GPU_CODEC, claims, counted) for p in pods]
    assert held == [10_000, 12_000, 12_000, 12_000, 0]
    member = online_member(CTD, pods[:3], H200_MIB, None, DEFAULT_GPU_CODEC, claims)
    assert member.per_replica_mib == 12_000 and member.observed_pods == 3
    # Without claims (the extended-resource profiles) nothing changes.
    assert online_member(CTD, pods[:1], H200_MIB).per_replica_mib == 10_000


def test_an_offline_job_on_claims_counts_its_template_before_its_pods_exist():
    template = {"metadata": {"name": "batch-gpu"}, "spec": {"spec": claim("x", 20_000)["spec"]}}
    job = {"metadata": {"name": "j", "namespace": "ns"},
           "spec": {"parallelism": 2, "suspend": True, "template": {"spec": pod("p", template="batch-gpu")["spec"]}}}
    member = offline_member(job, [], H200_MIB, DEFAULT_GPU_CODEC, Claims.of([], [template]))
    assert member.per_pod_mib == 20_000 and member.demand_mib == 40_000


def test_the_quantization_job_claims_through_the_template_it_is_given():
    q = QuantizationSpec.model_validate({"calibration": {"configMap": {"name": "c", "key": "k"}},
                                         "output": {"claimName": "out"}})
    job = build_quantization_job(ctd_name="tts", namespace="ns", owner_uid="u", q=q,
                                 source=PvcDirectory(claim_name="w"), digest="abc",
                                 placement=JobPlacement(image="i", gpu_claim_template="tts-quantize-gpu-1234"))
    pod = job["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "tts-quantize-gpu-1234"}]
    assert pod["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
