#!/usr/bin/env python3
"""Simulated Dynamic Resource Allocation GPUs for the local control plane.

What NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, read at v0.5.0-dev) would
publish for the simulated GPU nodes of nodes.yaml, without its kubelet plugin:

- a DeviceClass ``gpu.nvidia.com`` selecting the driver's full GPUs (its chart's selector);
- one ResourceSlice per GPU node (pool = the node), one device per GPU (``gpu-<i>``) with the
  attributes the driver publishes for a full GPU (``type``, ``uuid``, ``productName``,
  ``brand``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion``) and its memory as the ``memory`` capacity; as with the driver's
  ``--consumable-shares=memory`` (alpha gate ``ConsumableShares``), every device allows
  multiple allocations and its memory is consumable in 1Mi steps (default: all of it).

Real: the API objects, the scheduler's allocation (KEP-5075 consumable capacity, beta and on
by default in Kubernetes 1.36), the claim controller making claims from templates.
Simulated: the devices (no GPU exists), NVML's values (UUIDs derived from node and index,
fixed driver versions), and the kubelet side (kwok marks a pod Running once it is bound; no
plugin prepares the claim). MIG nodes get no slice: partitionable devices are not simulated.
The same GPUs are also advertised as extended resources (nodes.yaml), and the scheduler does
not know they are one: a pod asks through one or the other; the share policy counts each pod
once, by what it asked.

Pure builders plus ``apply`` (used by localcluster.py after the nodes are created):

    python hack/cluster/draslices.py manifests      # print the objects as YAML
"""
from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpunodes  # noqa: E402  (sibling module)

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"
RESOURCE_API = "resource.k8s.io/v1"
# What the simulated NVML reports (a 570-series data-centre driver).
DRIVER_VERSION = "570.124.6"
CUDA_DRIVER_VERSION = "12.8.0"
FIELD_MANAGER = "chattts-localcluster"
_ARCHITECTURE = {"ampere": "Ampere", "hopper": "Hopper", "blackwell": "Blackwell"}


@dataclass(frozen=True)
class SimulatedGpu:
    name: str            # the device name in the pool: gpu-<index>
    uuid: str
    product: str         # NVML's name, e.g. "NVIDIA H200"
    architecture: str
    compute: str         # cudaComputeCapability, semver
    memory_mib: int


def nvml_product(gfd_product: str) -> str:
    """GFD's label is NVML's name with dashes for spaces; NVIDIA's names have one space
    after the brand ('NVIDIA H200', 'NVIDIA A100-SXM4-80GB')."""
    return gfd_product.replace("-", " ", 1)


def node_gpus(spec: gpunodes.NodeSpec) -> list[SimulatedGpu]:
    """The devices of one simulated node (none for MIG-partitioned nodes)."""
    flavour = spec.flavour
    if flavour.mig_strategy:
        return []
    return [
        SimulatedGpu(
            name=f"gpu-{index}",
            uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{spec.name}.gpu-{index}.chattts.invalid")),
            product=nvml_product(flavour.product),
            architecture=_ARCHITECTURE.get(flavour.family, flavour.family.capitalize()),
            compute=f"{flavour.compute_major}.{flavour.compute_minor}.0",
            memory_mib=flavour.gpu_memory_mib,
        )
        for index in range(flavour.gpus)
    ]


def device(gpu: SimulatedGpu, shared: bool = True) -> dict[str, Any]:
    memory = f"{gpu.memory_mib}Mi"
    capacity: dict[str, Any] = {"value": memory}
    out: dict[str, Any] = {
        "name": gpu.name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": gpu.uuid},
            "productName": {"string": gpu.product},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": gpu.architecture},
            "cudaComputeCapability": {"version": gpu.compute},
            "driverVersion": {"version": DRIVER_VERSION},
            "cudaDriverVersion": {"version": CUDA_DRIVER_VERSION},
        },
        "capacity": {"memory": capacity},
    }
    if shared:
        capacity["requestPolicy"] = {"default": memory, "validRange": {"min": "1Mi", "max": memory, "step": "1Mi"}}
        out["allowMultipleAllocations"] = True
    return out


def resource_slice(node: str, gpus: list[SimulatedGpu], shared: bool = True, driver: str = DRIVER) -> dict[str, Any]:
    """The node's pool in one slice, as the driver's kubelet plugin publishes it."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device(gpu, shared) for gpu in gpus],
        },
    }


def device_class(name: str = DEVICE_CLASS, driver: str = DRIVER) -> dict[str, Any]:
    """The driver chart's GPU class. No extendedResourceName (KEP-5004): the simulated nodes
    advertise nvidia.com/gpu through the device plugin already."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {
            "expression": f"device.driver == '{driver}' && device.attributes['{driver}'].type == 'gpu'"}}]},
    }


def manifests(specs: list[gpunodes.NodeSpec]) -> list[dict[str, Any]]:
    out = [device_class()]
    for spec in specs:
        gpus = node_gpus(spec)
        if gpus:
            out.append(resource_slice(spec.name, gpus))
    return out


def object_path(manifest: dict[str, Any]) -> str:
    plural = {"ResourceSlice": "resourceslices", "DeviceClass": "deviceclasses"}[manifest["kind"]]
    return f"/apis/{RESOURCE_API}/{plural}/{manifest['metadata']['name']}"


def apply(api: Callable[..., tuple[int, Any]], objects: list[dict[str, Any]]) -> None:
    """Server-side apply each object through ``api(method, path, body, content_type)``
    (LocalCluster.api); raises RuntimeError on a refusal."""
    for manifest in objects:
        path = f"{object_path(manifest)}?fieldManager={FIELD_MANAGER}&force=true"
        status, body = api("PATCH", path, manifest, "application/apply-patch+yaml")
        if status >= 300:
            raise RuntimeError(f"applying {manifest['kind']} {manifest['metadata']['name']} failed ({status}): {body}")


def main(argv: list[str]) -> int:
    if argv[1:] != ["manifests"]:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(manifests(gpunodes.load_nodes()), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
