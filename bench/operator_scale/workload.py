"""What the benchmark applies (pure): ChatTTSDeployments, the baseline's children made by
the operator's own builders, and unrelated Deployments and Pods."""
from __future__ import annotations

from typing import Any

from chattts_operator.api.chattts import API_VERSION, KIND
from chattts_operator.core.labels import CONFIG_HASH_ANNOTATION, LABEL_MANAGED_BY, MANAGED_BY
from chattts_operator.deployment.spec import desired_state, parse_spec
from chattts_operator.core.settings import OperatorSettings

MANAGED_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
CHILD_KINDS = ("ConfigMap", "Deployment", "Service", "PodDisruptionBudget")
# The largest GPU of the benchmark's nodes (nodes.yaml: H200, MiB per GPU).
LARGEST_GPU_MIB = 143771
# Extended resources fit 140 of these per benchmark node (8 x 143771 MiB).
GPU_MEMORY = "8Gi"


def ctd_name(index: int) -> str:
    return f"tts-{index:04d}"


def chattts_deployment(name: str, namespace: str, replicas: int = 1, max_num_seqs: int = 64) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"hostPath": {"path": "/srv/models/chattts"}, "format": "fp16"},
            "gpu": {"memory": GPU_MEMORY},
            # vllm: its plan fits 8Gi at any maxNumSeqs here (the KV cache gets what is left), so every
            # object rolls out, as in the runs recorded before the default engine became graph.
            "engine": {"kind": "vllm", "maxNumSeqs": max_num_seqs},
            "replicas": replicas,
        },
    }


def baseline_children(created_ctd: dict[str, Any], settings: OperatorSettings) -> list[dict[str, Any]]:
    """The child objects the operator would apply for this (already created) object."""
    desired = desired_state(created_ctd, parse_spec(created_ctd), settings, largest_node_gpu_mib=LARGEST_GPU_MIB)
    if not desired.rollout_allowed:
        raise ValueError(f"benchmark spec does not fit: {desired.capacity.message}")
    return desired.children()


def config_hash_of(deployment: dict[str, Any]) -> str | None:
    template = (deployment.get("spec") or {}).get("template") or {}
    return ((template.get("metadata") or {}).get("annotations") or {}).get(CONFIG_HASH_ANNOTATION)


def unrelated_deployment(index: int, namespace: str) -> dict[str, Any]:
    """A Deployment of some other team: nothing the operator manages (replicas 0: no pods)."""
    labels = {"app": f"other-{index}", "team": "unrelated"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": f"other-{index:05d}", "namespace": namespace, "labels": labels,
                     "annotations": {"description": "unrelated workload " + "x" * 200}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1",
                                                  "env": [{"name": f"VAR_{i}", "value": f"value-{i}"}
                                                          for i in range(10)],
                                                  "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}},
        },
    }


def unrelated_pod(index: int, namespace: str) -> dict[str, Any]:
    """A Pod of some other team. Its scheduler does not exist, so it stays Pending and costs the
    scheduler and kwok nothing; it still is a full Pod object in every Pod list and watch."""
    labels = {"app": f"other-pod-{index}", "team": "unrelated"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"other-pod-{index:05d}", "namespace": namespace, "labels": labels},
        "spec": {"schedulerName": "bench-no-such-scheduler",
                 "containers": [{"name": "app", "image": "registry.invalid/app:1",
                                 "env": [{"name": f"VAR_{i}", "value": f"value-{i}"} for i in range(10)],
                                 "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]},
    }
