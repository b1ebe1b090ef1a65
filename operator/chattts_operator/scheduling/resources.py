"""GPU memory of nodes and pods in MiB, whatever the sharing profile; label selectors.

Pure functions over plain Kubernetes object dicts (as the API returns them, camelCase).
A policy's shares are fractions of GPU *memory*, so every profile is brought to MiB:

- ``nvidia.com/gpu.memory`` (the field write-up's resource): MiB as given;
- HAMi ``nvidia.com/gpumem`` (MiB per GPU) x ``nvidia.com/gpu``; ``nvidia.com/gpumem-percentage``;
- ``nvidia.com/mig-<c>g.<m>gb``: m GiB per slice;
- ``volcano.sh/vgpu-memory``: MiB;
- whole ``nvidia.com/gpu``: the node's per-GPU memory (GFD label ``nvidia.com/gpu.memory``).
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

from chattts_operator.api.sharepolicy import LabelSelector

GPU_MEMORY_RESOURCE = "nvidia.com/gpu.memory"
GPU_RESOURCE = "nvidia.com/gpu"
HAMI_GPUMEM = "nvidia.com/gpumem"
HAMI_GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
VOLCANO_VGPU_MEMORY = "volcano.sh/vgpu-memory"
GFD_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per GPU, published by GPU Feature Discovery
GFD_COUNT_LABEL = "nvidia.com/gpu.count"
_MIG = re.compile(r"^nvidia\.com/mig-(\d+)g\.(\d+)gb$")

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
MIB = 2**20


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ('24Gi', '1500M', '3', 3) as a Decimal; ValueError if malformed."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    text = str(value).strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"invalid quantity {value!r}: expected a number with an optional suffix such as Mi or Gi")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        raise ValueError(f"invalid quantity {value!r}") from None
    suffix = match.group(2) or ""
    return number * (_BINARY[suffix] if suffix in _BINARY else _DECIMAL[suffix])


def bytes_to_mib(quantity: Any) -> int:
    """A memory quantity in bytes ('24Gi') -> whole MiB, rounded up (never under-count)."""
    return int(math.ceil(parse_quantity(quantity) / MIB))


def _count(value: Any) -> int:
    return int(parse_quantity(value))


def per_gpu_memory_mib(node: Mapping[str, Any]) -> int:
    """MiB of one GPU on the node, from the GFD label (0 if unknown)."""
    labels = node.get("metadata", {}).get("labels") or {}
    raw = labels.get(GFD_MEMORY_LABEL)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def node_gpu_memory_mib(node: Mapping[str, Any]) -> int:
    """The node's total GPU memory in MiB: the ``nvidia.com/gpu.memory`` resource if the node
    advertises it, else per-GPU memory (GFD label) x whole GPUs plus its MIG slices."""
    status = node.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    if GPU_MEMORY_RESOURCE in allocatable:
        return _count(allocatable[GPU_MEMORY_RESOURCE])
    if VOLCANO_VGPU_MEMORY in allocatable:
        return _count(allocatable[VOLCANO_VGPU_MEMORY])
    # MIG slices, counted the way pods ask for them (the profile's GiB), so both sides agree.
    mig = sum(int(m.group(2)) * 1024 * _count(v) for k, v in allocatable.items() if (m := _MIG.match(k)))
    per_gpu = per_gpu_memory_mib(node)
    labels = node.get("metadata", {}).get("labels") or {}
    if GPU_RESOURCE in allocatable:
        gpus = _count(allocatable[GPU_RESOURCE])
    elif GFD_COUNT_LABEL in labels:
        gpus = _count(labels[GFD_COUNT_LABEL])
    else:
        gpus = 0
    return per_gpu * gpus + mig


def node_is_usable(node: Mapping[str, Any]) -> bool:
    """Ready and schedulable: only such nodes count in the pool."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def container_gpu_memory_mib(resources: Mapping[str, Any] | None, per_gpu_mib: int) -> int:
    """MiB of GPU memory one container asks (limits; requests must equal them for extended resources)."""
    resources = resources or {}
    limits = dict(resources.get("requests") or {})
    limits.update(resources.get("limits") or {})
    if GPU_MEMORY_RESOURCE in limits:
        return _count(limits[GPU_MEMORY_RESOURCE])
    if VOLCANO_VGPU_MEMORY in limits:
        return _count(limits[VOLCANO_VGPU_MEMORY])
    gpus = _count(limits[GPU_RESOURCE]) if GPU_RESOURCE in limits else 0
    if HAMI_GPUMEM in limits:
        return _count(limits[HAMI_GPUMEM]) * max(gpus, 1)
    if HAMI_GPUMEM_PERCENT in limits:
        return int(math.ceil(_count(limits[HAMI_GPUMEM_PERCENT]) * per_gpu_mib * max(gpus, 1) / 100))
    mib = 0
    for name, value in limits.items():
        match = _MIG.match(name)
        if match:
            mib += int(match.group(2)) * 1024 * _count(value)
    if mib:
        return mib
    return gpus * per_gpu_mib


def pod_spec_gpu_memory_mib(pod_spec: Mapping[str, Any] | None, per_gpu_mib: int) -> int:
    """MiB a pod asks: its containers together, or its largest init container if more
    (init containers run one at a time, before the others), as the scheduler counts."""
    pod_spec = pod_spec or {}
    main = sum(container_gpu_memory_mib(c.get("resources"), per_gpu_mib) for c in pod_spec.get("containers") or [])
    init = max(
        (container_gpu_memory_mib(c.get("resources"), per_gpu_mib) for c in pod_spec.get("initContainers") or []),
        default=0,
    )
    return max(main, init)


def selector_matches(selector: LabelSelector, labels: Mapping[str, str] | None) -> bool:
    """Kubernetes label-selector semantics: every matchLabels pair and every expression holds."""
    labels = labels or {}
    for key, value in selector.match_labels.items():
        if labels.get(key) != value:
            return False
    for req in selector.match_expressions:
        present = req.key in labels
        if req.operator == "In" and (not present or labels[req.key] not in req.values):
            return False
        if req.operator == "NotIn" and present and labels[req.key] in req.values:
            return False
        if req.operator == "Exists" and not present:
            return False
        if req.operator == "DoesNotExist" and present:
            return False
    return True


def selector_string(selector: LabelSelector) -> str:
    """The selector in the API's ``labelSelector`` query syntax, for server-side filtering."""
    parts = [f"{k}={v}" for k, v in sorted(selector.match_labels.items())]
    for req in selector.match_expressions:
        if req.operator == "In":
            parts.append(f"{req.key} in ({','.join(sorted(req.values))})")
        elif req.operator == "NotIn":
            parts.append(f"{req.key} notin ({','.join(sorted(req.values))})")
        elif req.operator == "Exists":
            parts.append(req.key)
        else:
            parts.append(f"!{req.key}")
    return ",".join(parts)
