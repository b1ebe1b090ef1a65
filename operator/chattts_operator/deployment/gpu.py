"""The GPU codec, both directions, pure: a spec's ``gpu`` block -> pod resources and node
affinity (``assign_gpu``), and pod resources or a node -> GPU memory in MiB (``GpuCodec``,
what a GPUSharePolicy counts). Both use the configured resource and label names and the
same MiB per MIG profile, so the share policy counts what the deployment asked for.
Extended resources are whole numbers and go in ``limits`` only (Kubernetes copies them to
requests).

- ``gpu-memory``: ``<gpu memory resource>: memory MiB x count`` (the form of our starting write-up)
- ``hami``: ``nvidia.com/gpu: count`` and ``nvidia.com/gpumem: memory MiB`` (HAMi's memory is per GPU)
- ``whole-gpu``: ``nvidia.com/gpu: count``
- ``mig``: ``nvidia.com/mig-<profile>: count``, the smallest configured profile whose memory fits
- ``dra``: no extended resource; a ResourceClaimTemplate (``DraRequest.claim_spec``) asks
  ``count`` devices of the configured DeviceClass, each with at least the memory asked and,
  with consumable capacity (KEP-5075), a ``memory`` capacity request of exactly that much, so
  several claims share one GPU; the scheduler allocates them.

In every profile but ``dra`` the pods require nodes whose GFD label ``nvidia.com/gpu.memory``
(MiB per GPU) is at least the memory asked per GPU; in ``dra`` the device selector says it.

The reverse direction for claims (``GpuCodec.claim_memory_mib``): an allocated claim counts
what its allocation consumed on each device of the driver (``consumedCapacity.memory``; a
device handed out whole counts as a whole GPU), a claim not allocated yet what it requests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from chattts_operator.api.chattts import GpuProfile, GpuSpec
from chattts_operator.api.common import parse_live_quantity
from chattts_operator.core.settings import MIG_PROFILE_PATTERN, OperatorSettings

# MIG profile names give the slice's memory in decimal GB (3g.40gb: 40 GB = 38,146 MiB); the
# smaller figure, so a budget never counts on memory the slice lacks.
_MIB_PER_GB = 1000**3 / 2**20
# Resources no setting renames: HAMi's percentage of a GPU, Volcano's MiB.
HAMI_MEMORY_PERCENT_RESOURCE = "nvidia.com/gpumem-percentage"
VOLCANO_MEMORY_RESOURCE = "volcano.sh/vgpu-memory"
GFD_COUNT_LABEL = "nvidia.com/gpu.count"
GFD_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU, published by GPU Feature Discovery


class GpuAssignmentError(ValueError):
    """The gpu block cannot be expressed in the chosen profile (e.g. no MIG profile is big enough)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_MIB = 2**20


@dataclass(frozen=True)
class DraRequest:
    """The dra profile's device request for one replica: one device per tensor-parallel rank."""

    device_class: str
    driver: str
    count: int
    memory_mib: int
    consumable: bool  # a memory capacity request (shared devices) rather than whole devices
    product: str | None = None

    def selectors(self) -> list[dict[str, Any]]:
        """CEL over the driver's attributes and capacity (NVIDIA's names: productName, memory)."""
        device = f"device.capacity[{self.driver!r}]"
        rules = [f"{device}.memory.compareTo(quantity('{self.memory_mib}Mi')) >= 0"]
        if self.product:
            # GFD's product label is NVML's name with dashes for spaces ('NVIDIA-H200'); the
            # driver publishes NVML's name ('NVIDIA H200'): either spelling matches.
            name = f"device.attributes[{self.driver!r}].productName"
            rules.append(f"({name} == {self.product!r} || {name}.replace(' ', '-') == {self.product!r})")
        return [{"cel": {"expression": rule}} for rule in rules]

    def claim_spec(self) -> dict[str, Any]:
        """A ResourceClaimSpec (resource.k8s.io/v1)."""
        exactly: dict[str, Any] = {
            "deviceClassName": self.device_class,
            "allocationMode": "ExactCount",
            "count": self.count,
            "selectors": self.selectors(),
        }
        if self.consumable:
            exactly["capacity"] = {"requests": {"memory": f"{self.memory_mib}Mi"}}
        devices: dict[str, Any] = {"requests": [{"name": DRA_REQUEST_NAME, "exactly": exactly}]}
        if self.count > 1 and self.consumable:
            # A shareable device could otherwise serve two ranks of one replica.
            devices["constraints"] = [{"requests": [DRA_REQUEST_NAME], "distinctAttribute": f"{self.driver}/uuid"}]
        return {"devices": devices}


DRA_REQUEST_NAME = "gpu"


@dataclass(frozen=True)
class GpuAssignment:
    profile: GpuProfile
    gpu_count: int  # GPUs (or MIG slices) per replica: the tensor parallel size
    limits: dict[str, str]
    memory_per_gpu_mib: int  # what the planner may budget on one GPU of a replica
    node_min_gpu_memory_mib: int | None  # nodes need a GPU label >= this; None: no affinity
    node_selector: dict[str, str] = field(default_factory=dict)
    mig_profile: str | None = None
    dra: DraRequest | None = None

    @property
    def share(self) -> str:
        """The printer column: '1x8Gi gpu-memory', '2x3g.40gb mig'."""
        per_gpu = self.mig_profile or _format_mib(self.memory_per_gpu_mib)
        return f"{self.gpu_count}x{per_gpu} {self.profile.value}"


def _format_mib(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def mig_profile_memory_mib(profile: str) -> int:
    match = MIG_PROFILE_PATTERN.match(profile)
    if not match:
        raise ValueError(f"not a MIG profile: {profile!r}")
    return int(int(match.group("gb")) * _MIB_PER_GB)


def _count(value: Any) -> int:
    """A whole-number extended resource (a quantity: '2', 2, '1k')."""
    return int(parse_live_quantity(value))


def smallest_mig_profile(memory_mib: int, profiles: tuple[str, ...]) -> str | None:
    """The profile with the least memory that still holds ``memory_mib``; among equals, the fewest slices."""
    fitting = [p for p in profiles if mig_profile_memory_mib(p) >= memory_mib]
    if not fitting:
        return None
    return min(fitting, key=lambda p: (mig_profile_memory_mib(p), int(MIG_PROFILE_PATTERN.match(p).group("slices")), p))


def resolve_profile(gpu: GpuSpec, settings: OperatorSettings) -> GpuProfile:
    return gpu.profile or settings.gpu_profile


def assign_gpu(gpu: GpuSpec, settings: OperatorSettings) -> GpuAssignment:
    """Pod resources and node placement for one replica."""
    profile = resolve_profile(gpu, settings)
    memory_mib = gpu.memory_mib
    count = gpu.count
    mig_profile = None
    budget_mib = memory_mib
    if profile is GpuProfile.GPU_MEMORY:
        limits = {settings.gpu_memory_resource: str(memory_mib * count)}
    elif profile is GpuProfile.HAMI:
        limits = {settings.gpu_resource: str(count), settings.hami_memory_resource: str(memory_mib)}
    elif profile is GpuProfile.WHOLE_GPU:
        limits = {settings.gpu_resource: str(count)}
    elif profile is GpuProfile.MIG:
        mig_profile = smallest_mig_profile(memory_mib, settings.mig_profiles)
        if mig_profile is None:
            largest = max(settings.mig_profiles, key=mig_profile_memory_mib, default="none")
            raise GpuAssignmentError(
                "NoMigProfileFits",
                f"gpu.memory {gpu.memory} ({memory_mib} MiB) is larger than every configured MIG profile "
                f"(largest: {largest})",
            )
        limits = {f"{settings.mig_resource_prefix}{mig_profile}": str(count)}
        budget_mib = mig_profile_memory_mib(mig_profile)
    elif profile is GpuProfile.DRA:
        dra = DraRequest(device_class=settings.dra_device_class, driver=settings.dra_driver, count=count,
                         memory_mib=memory_mib, consumable=settings.dra_consumable_capacity, product=gpu.product)
        # The device selector picks the GPU (product and size): no node label is involved.
        return GpuAssignment(profile=profile, gpu_count=count, limits={}, memory_per_gpu_mib=memory_mib,
                             node_min_gpu_memory_mib=None, node_selector=dict(gpu.node_selector or {}), dra=dra)
    else:  # pragma: no cover - the enum is closed
        raise GpuAssignmentError("UnknownProfile", f"unknown GPU sharing profile {profile}")

    node_selector = dict(gpu.node_selector or {})
    if gpu.product:
        node_selector[settings.node_product_label] = gpu.product
    return GpuAssignment(
        profile=profile,
        gpu_count=count,
        limits=limits,
        memory_per_gpu_mib=budget_mib,
        node_min_gpu_memory_mib=memory_mib if settings.node_memory_label else None,
        node_selector=node_selector,
        mig_profile=mig_profile,
    )


def node_affinity(assignment: GpuAssignment, settings: OperatorSettings) -> dict | None:
    """Required node affinity: GPUs at least as large as asked (GFD label, MiB, compared with Gt)."""
    if assignment.node_min_gpu_memory_mib is None:
        return None
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": settings.node_memory_label,
                                "operator": "Gt",
                                "values": [str(assignment.node_min_gpu_memory_mib - 1)],
                            }
                        ]
                    }
                ]
            }
        }
    }


@dataclass(frozen=True)
class GpuCodec:
    """Pod resources and nodes -> GPU memory in MiB, with the operator's configured names
    (the reverse of ``assign_gpu``: a pod it built counts exactly its assignment)."""

    gpu_memory_resource: str
    gpu_resource: str
    hami_memory_resource: str
    mig_resource_prefix: str
    node_memory_label: str
    dra_driver: str = "gpu.nvidia.com"

    @classmethod
    def from_settings(cls, settings: OperatorSettings) -> "GpuCodec":
        return cls(
            gpu_memory_resource=settings.gpu_memory_resource,
            gpu_resource=settings.gpu_resource,
            hami_memory_resource=settings.hami_memory_resource,
            mig_resource_prefix=settings.mig_resource_prefix,
            # Counting needs the per-GPU size even where affinity on it is off.
            node_memory_label=settings.node_memory_label or GFD_MEMORY_LABEL,
            dra_driver=settings.dra_driver,
        )

    def mig_memory_mib(self, resources: Mapping[str, Any]) -> int:
        """MiB of the MIG slices among ``resources`` (name -> count)."""
        mib = 0
        for name, value in resources.items():
            profile = name.removeprefix(self.mig_resource_prefix)
            if profile != name and MIG_PROFILE_PATTERN.match(profile):
                mib += mig_profile_memory_mib(profile) * _count(value)
        return mib

    def per_gpu_memory_mib(self, node: Mapping[str, Any]) -> int:
        """MiB of one GPU on the node, from the GFD label (0 if unknown)."""
        labels = node.get("metadata", {}).get("labels") or {}
        raw = labels.get(self.node_memory_label)
        try:
            return int(raw) if raw is not None else 0
        except ValueError:
            return 0

    def node_memory_mib(self, node: Mapping[str, Any]) -> int:
        """The node's total GPU memory in MiB, each device counted once: the GPU-memory resource
        if the node advertises it, else its MIG slices plus per-GPU memory (GFD label) x the whole
        GPUs it can schedule. With MIG slices, whole GPUs are only what the device plugin
        advertises as such (mixed strategy: the GPUs not partitioned): GFD's gpu.count counts the
        partitioned GPUs too, whose memory the slices already hold."""
        status = node.get("status") or {}
        allocatable = status.get("allocatable") or status.get("capacity") or {}
        for resource in (self.gpu_memory_resource, VOLCANO_MEMORY_RESOURCE):
            if resource in allocatable:
                return _count(allocatable[resource])
        labels = node.get("metadata", {}).get("labels") or {}
        mig = self.mig_memory_mib(allocatable)
        if self.gpu_resource in allocatable:
            gpus = _count(allocatable[self.gpu_resource])
        elif GFD_COUNT_LABEL in labels and not mig:
            gpus = _count(labels[GFD_COUNT_LABEL])
        else:
            gpus = 0
        return self.per_gpu_memory_mib(node) * gpus + mig

    def container_memory_mib(self, resources: Mapping[str, Any] | None, per_gpu_mib: int) -> int:
        """MiB of GPU memory one container asks (limits; requests must equal them for
        extended resources). A whole GPU counts as ``per_gpu_mib``."""
        resources = resources or {}
        limits = dict(resources.get("requests") or {})
        limits.update(resources.get("limits") or {})
        for resource in (self.gpu_memory_resource, VOLCANO_MEMORY_RESOURCE):
            if resource in limits:
                return _count(limits[resource])
        gpus = _count(limits[self.gpu_resource]) if self.gpu_resource in limits else 0
        if self.hami_memory_resource in limits:
            return _count(limits[self.hami_memory_resource]) * max(gpus, 1)
        if HAMI_MEMORY_PERCENT_RESOURCE in limits:
            return int(math.ceil(_count(limits[HAMI_MEMORY_PERCENT_RESOURCE]) * per_gpu_mib * max(gpus, 1) / 100))
        return self.mig_memory_mib(limits) or gpus * per_gpu_mib

    def pod_spec_memory_mib(self, pod_spec: Mapping[str, Any] | None, per_gpu_mib: int) -> int:
        """MiB a pod asks: its containers together, or its largest init container if more
        (init containers run one at a time, before the others), as the scheduler counts."""
        pod_spec = pod_spec or {}
        main = sum(self.container_memory_mib(c.get("resources"), per_gpu_mib) for c in pod_spec.get("containers") or [])
        init = max((self.container_memory_mib(c.get("resources"), per_gpu_mib)
                    for c in pod_spec.get("initContainers") or []), default=0)
        return max(main, init)

    # --- Dynamic Resource Allocation: claims -> MiB ------------------------------------------

    def claim_spec_memory_mib(self, claim_spec: Mapping[str, Any] | None, per_gpu_mib: int) -> int:
        """MiB a ResourceClaimSpec requests: per device its memory capacity request, or a
        whole GPU; times the count (devices of other drivers' classes count too: the class
        name does not say the driver, and a request without memory is a whole device)."""
        total = 0
        for request in ((claim_spec or {}).get("devices") or {}).get("requests") or []:
            exactly = request.get("exactly") or {}
            if not exactly:
                continue  # firstAvailable: a choice not made yet; counted once allocated
            memory = ((exactly.get("capacity") or {}).get("requests") or {}).get("memory")
            per_device = _bytes_mib(memory) if memory is not None else per_gpu_mib
            total += per_device * int(exactly.get("count", 1) or 1)
        return total

    def allocated_devices(self, claim: Mapping[str, Any], per_gpu_mib: int) -> list[tuple[str, str, int]]:
        """(pool, device, MiB) for each device of the driver the claim's allocation holds:
        the memory consumed on a shared device, a whole GPU otherwise."""
        allocation = (claim.get("status") or {}).get("allocation") or {}
        found = []
        for result in (allocation.get("devices") or {}).get("results") or []:
            if result.get("driver") != self.dra_driver:
                continue
            consumed = (result.get("consumedCapacity") or {}).get("memory")
            mib = _bytes_mib(consumed) if consumed is not None else per_gpu_mib
            found.append((str(result.get("pool", "")), str(result.get("device", "")), mib))
        return found

    def claim_memory_mib(self, claim: Mapping[str, Any], per_gpu_mib: int) -> int:
        """MiB a ResourceClaim holds (allocated) or asks (not allocated yet)."""
        if (claim.get("status") or {}).get("allocation"):
            return sum(mib for _, _, mib in self.allocated_devices(claim, per_gpu_mib))
        return self.claim_spec_memory_mib(claim.get("spec"), per_gpu_mib)

    def pod_claims_memory_mib(self, pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any]],
                              templates: Mapping[str, Mapping[str, Any]], per_gpu_mib: int,
                              counted: set[str] | None = None) -> int:
        """MiB a pod's ResourceClaims hold or ask: its generated or named claims (by name in
        ``claims``), a template's request when the claim is not made yet. ``counted``: claim
        names already counted (a claim shared by several pods counts once)."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
        counted = set() if counted is None else counted
        mib = 0
        for ref in spec.get("resourceClaims") or []:
            name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
            if name in claims:
                if name not in counted:
                    counted.add(name)
                    mib += self.claim_memory_mib(claims[name], per_gpu_mib)
            elif ref.get("resourceClaimTemplateName") in templates:
                template = templates[ref["resourceClaimTemplateName"]]
                mib += self.claim_spec_memory_mib((template.get("spec") or {}).get("spec"), per_gpu_mib)
        return mib


def dra_allocation_status(template_name: str, device_class: str, claims: list[Mapping[str, Any]],
                          codec: GpuCodec, whole_device_mib: int) -> dict[str, Any]:
    """status.gpu.dra: the serving pods' claims (a rollout's old pods' included: they hold
    memory too) and the devices their allocations hold. ``template_name`` is the template in
    use ('' while leaving the profile)."""
    devices, allocated = [], 0
    for claim in sorted(claims, key=lambda c: c["metadata"]["name"]):
        held = codec.allocated_devices(claim, whole_device_mib)
        if (claim.get("status") or {}).get("allocation"):
            allocated += 1
        devices += [{"claim": claim["metadata"]["name"], "pool": pool, "device": device, "memoryMiB": mib}
                    for pool, device, mib in held]
    return {
        "resourceClaimTemplate": template_name,
        "deviceClass": device_class,
        "claims": len(claims),
        "allocatedClaims": allocated,
        "allocatedMemoryMiB": sum(d["memoryMiB"] for d in devices),
        "devices": devices,
    }


def _bytes_mib(quantity: Any) -> int:
    """A capacity quantity (bytes: '8Gi', '8589934592') in MiB, rounded up."""
    return int(math.ceil(parse_live_quantity(quantity) / _MIB))


DEFAULT_GPU_CODEC = GpuCodec.from_settings(OperatorSettings())
