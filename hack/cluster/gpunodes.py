"""Node manifests for the simulated GPU nodes declared in nodes.yaml.

Pure: reading and checking the declaration, and turning it into Node objects
(``kind: Node`` dicts, status included) that localcluster.py creates and kwok
then keeps Ready. Nothing here talks to a cluster.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

NODES_FILE = Path(__file__).resolve().parent / "nodes.yaml"

# kwok (started with --manage-nodes-with-annotation-selector) manages nodes carrying this.
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")

GPU = "nvidia.com/gpu"
GPU_MEMORY = "nvidia.com/gpu.memory"
HAMI_GPUMEM = "nvidia.com/gpumem"
HAMI_GPUCORES = "nvidia.com/gpucores"
MIG_PREFIX = "nvidia.com/mig-"

_MIG_PROFILE = re.compile(r"^[1-7]g\.[0-9]+gb(\+me)?$")
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")


class NodesFileError(ValueError):
    """nodes.yaml does not describe a valid set of nodes."""


@dataclass(frozen=True)
class MigProfile:
    name: str          # e.g. "1g.18gb"
    per_gpu: int       # instances of this profile on each GPU
    memory_mib: int    # memory of one instance


@dataclass(frozen=True)
class Flavour:
    name: str
    product: str
    family: str
    compute_major: int
    compute_minor: int
    gpus: int
    gpu_memory_mib: int
    cpu: str
    memory: str
    pods: int
    mig_strategy: str | None
    mig_profiles: tuple[MigProfile, ...]


@dataclass(frozen=True)
class NodeSpec:
    name: str
    flavour: Flavour


def _require(mapping: dict, key: str, where: str) -> Any:
    if key not in mapping:
        raise NodesFileError(f"{where}: missing '{key}'")
    return mapping[key]


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise NodesFileError(f"{where}: expected a positive whole number, got {value!r}")
    return value


def _quantity(value: Any, where: str) -> str:
    text = str(value)
    if not _QUANTITY.match(text):
        raise NodesFileError(f"{where}: {value!r} is not a Kubernetes quantity")
    return text


def _parse_flavour(name: str, raw: Any) -> Flavour:
    where = f"flavour {name!r}"
    if not isinstance(raw, dict):
        raise NodesFileError(f"{where}: expected a mapping")
    known = {"product", "family", "computeMajor", "computeMinor", "gpus", "gpuMemoryMiB",
             "cpu", "memory", "pods", "mig"}
    unknown = set(raw) - known
    if unknown:
        raise NodesFileError(f"{where}: unknown keys {sorted(unknown)}")
    profiles: list[MigProfile] = []
    strategy = None
    if "mig" in raw:
        mig = raw["mig"]
        strategy = _require(mig, "strategy", f"{where}.mig")
        if strategy != "mixed":
            raise NodesFileError(f"{where}.mig.strategy: only 'mixed' is simulated, got {strategy!r}")
        per_gpu = _require(mig, "perGpu", f"{where}.mig")
        if not isinstance(per_gpu, dict) or not per_gpu:
            raise NodesFileError(f"{where}.mig.perGpu: expected a non-empty mapping of profiles")
        for profile, spec in per_gpu.items():
            pwhere = f"{where}.mig.perGpu.{profile}"
            if not _MIG_PROFILE.match(str(profile)):
                raise NodesFileError(f"{pwhere}: not a MIG profile name like '1g.18gb'")
            profiles.append(MigProfile(
                name=str(profile),
                per_gpu=_positive_int(_require(spec, "count", pwhere), f"{pwhere}.count"),
                memory_mib=_positive_int(_require(spec, "memoryMiB", pwhere), f"{pwhere}.memoryMiB"),
            ))
    flavour = Flavour(
        name=name,
        product=str(_require(raw, "product", where)),
        family=str(_require(raw, "family", where)),
        compute_major=int(_require(raw, "computeMajor", where)),
        compute_minor=int(_require(raw, "computeMinor", where)),
        gpus=_positive_int(_require(raw, "gpus", where), f"{where}.gpus"),
        gpu_memory_mib=_positive_int(_require(raw, "gpuMemoryMiB", where), f"{where}.gpuMemoryMiB"),
        cpu=_quantity(_require(raw, "cpu", where), f"{where}.cpu"),
        memory=_quantity(_require(raw, "memory", where), f"{where}.memory"),
        pods=_positive_int(_require(raw, "pods", where), f"{where}.pods"),
        mig_strategy=strategy,
        mig_profiles=tuple(profiles),
    )
    for p in flavour.mig_profiles:
        if p.memory_mib * p.per_gpu > flavour.gpu_memory_mib:
            raise NodesFileError(f"{where}: MIG profile {p.name} x{p.per_gpu} exceeds one GPU's memory")
    return flavour


def parse_nodes(document: Any) -> list[NodeSpec]:
    """Check a nodes.yaml document and resolve each node's flavour."""
    if not isinstance(document, dict):
        raise NodesFileError("nodes file: expected a mapping with 'flavours' and 'nodes'")
    flavours_raw = _require(document, "flavours", "nodes file")
    nodes_raw = _require(document, "nodes", "nodes file")
    if not isinstance(flavours_raw, dict) or not isinstance(nodes_raw, list):
        raise NodesFileError("nodes file: 'flavours' must be a mapping and 'nodes' a list")
    flavours = {name: _parse_flavour(name, raw) for name, raw in flavours_raw.items()}
    specs: list[NodeSpec] = []
    seen: set[str] = set()
    for index, entry in enumerate(nodes_raw):
        where = f"nodes[{index}]"
        if not isinstance(entry, dict):
            raise NodesFileError(f"{where}: expected a mapping with 'name' and 'flavour'")
        name = str(_require(entry, "name", where))
        if not _NODE_NAME.match(name) or len(name) > 63:
            raise NodesFileError(f"{where}: {name!r} is not a valid node name")
        if name in seen:
            raise NodesFileError(f"{where}: duplicate node name {name!r}")
        seen.add(name)
        flavour_name = _require(entry, "flavour", where)
        if flavour_name not in flavours:
            raise NodesFileError(f"{where}: unknown flavour {flavour_name!r} (known: {sorted(flavours)})")
        specs.append(NodeSpec(name=name, flavour=flavours[flavour_name]))
    return specs


def load_nodes(path: Path | str = NODES_FILE) -> list[NodeSpec]:
    with open(path, encoding="utf-8") as handle:
        return parse_nodes(yaml.safe_load(handle))


def gfd_labels(flavour: Flavour) -> dict[str, str]:
    """Labels GPU Feature Discovery puts on a node of this flavour."""
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": flavour.product,
        "nvidia.com/gpu.family": flavour.family,
        "nvidia.com/gpu.count": str(flavour.gpus),
        "nvidia.com/gpu.memory": str(flavour.gpu_memory_mib),
        "nvidia.com/gpu.compute.major": str(flavour.compute_major),
        "nvidia.com/gpu.compute.minor": str(flavour.compute_minor),
        "nvidia.com/mig.capable": "true" if flavour.family in ("ampere", "hopper", "blackwell") else "false",
    }
    if flavour.mig_strategy:
        labels["nvidia.com/mig.strategy"] = flavour.mig_strategy
        for p in flavour.mig_profiles:
            labels[f"nvidia.com/mig-{p.name}.count"] = str(p.per_gpu * flavour.gpus)
            labels[f"nvidia.com/mig-{p.name}.memory"] = str(p.memory_mib)
            labels[f"nvidia.com/mig-{p.name}.product"] = f"{flavour.product}-MIG-{p.name}"
    return labels


def gpu_resources(flavour: Flavour) -> dict[str, str]:
    """Extended resources the device plugins (NVIDIA, HAMi) would advertise."""
    if flavour.mig_strategy:
        # With every GPU partitioned, only MIG instances are schedulable.
        return {f"{MIG_PREFIX}{p.name}": str(p.per_gpu * flavour.gpus) for p in flavour.mig_profiles}
    total_mib = flavour.gpus * flavour.gpu_memory_mib
    return {
        GPU: str(flavour.gpus),
        GPU_MEMORY: str(total_mib),
        HAMI_GPUMEM: str(total_mib),
        HAMI_GPUCORES: str(100 * flavour.gpus),
    }


def node_manifest(spec: NodeSpec, index: int) -> dict[str, Any]:
    """The Node object, status included (kwok's node-initialize keeps capacity/allocatable)."""
    flavour = spec.flavour
    resources = {"cpu": flavour.cpu, "memory": flavour.memory, "pods": str(flavour.pods),
                 "ephemeral-storage": "1Ti", **gpu_resources(flavour)}
    pod_cidr = f"10.244.{index}.0/24"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "annotations": {
                KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1],
                "node.alpha.kubernetes.io/ttl": "0",
            },
            "labels": {
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": spec.name,
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "node-role.kubernetes.io/agent": "",
                "type": "kwok",
                "chattts.io/simulated-gpu-flavour": flavour.name,
                **gfd_labels(flavour),
            },
        },
        "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "addresses": [{"type": "InternalIP", "address": f"10.0.{index // 250}.{index % 250 + 2}"}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
        },
    }


def node_manifests(specs: list[NodeSpec]) -> list[dict[str, Any]]:
    return [node_manifest(spec, index) for index, spec in enumerate(specs)]
