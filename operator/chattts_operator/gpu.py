"""GPU sharing profiles: how a spec's ``gpu`` block becomes pod resources and node affinity.

Pure: (gpu spec, profile, settings) -> GpuAssignment. Extended resources are whole numbers
and go in ``limits`` only (Kubernetes copies them to requests).

- ``gpu-memory``: ``<gpu memory resource>: memory MiB x count`` (the form of our starting write-up)
- ``hami``: ``nvidia.com/gpu: count`` and ``nvidia.com/gpumem: memory MiB`` (HAMi's memory is per GPU)
- ``whole-gpu``: ``nvidia.com/gpu: count``
- ``mig``: ``nvidia.com/mig-<profile>: count``, the smallest configured profile whose memory fits

In every profile the pods require nodes whose GFD label ``nvidia.com/gpu.memory`` (MiB per
GPU) is at least the memory asked per GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from chattts_operator.api.chattts import GpuProfile, GpuSpec
from chattts_operator.settings import MIG_PROFILE_PATTERN, OperatorSettings

# MIG profile names use decimal GB of the slice; compare in MiB with the spec's memory.
_MIB_PER_GB = 1000**3 / 2**20


class GpuAssignmentError(ValueError):
    """The gpu block cannot be expressed in the chosen profile (e.g. no MIG profile is big enough)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GpuAssignment:
    profile: GpuProfile
    gpu_count: int  # GPUs (or MIG slices) per replica: the tensor parallel size
    limits: dict[str, str]
    memory_per_gpu_mib: int  # what the planner may budget on one GPU of a replica
    node_min_gpu_memory_mib: int | None  # nodes need a GPU label >= this; None: no affinity
    node_selector: dict[str, str] = field(default_factory=dict)
    mig_profile: str | None = None

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
