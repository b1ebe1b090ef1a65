"""Helpers shared by the cluster tier's modules: kubectl reads and writes, convergence checks."""
from __future__ import annotations

import json
from typing import Any

from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.children import CONFIG_KEY, mounted_configmap
from chattts_operator.deployment.spec import Desired, desired_state, parse_spec

INSTANCE = "app.kubernetes.io/instance"
MANAGED = "app.kubernetes.io/managed-by=chattts-operator"
CHILD_KINDS = ("deployments", "configmaps", "services", "poddisruptionbudgets")
# Operator settings of the tests' operator processes: the MIG profiles the simulated nodes
# (hack/cluster) offer, an image name no kubelet pulls, and no /health questions to kwok pods'
# made-up IPs (test traffic goes to loopback only: test_upstream_data.py turns them on).
OPERATOR_SETTINGS = {"mig_profiles": "1g.18gb,2g.35gb,3g.71gb", "runtime_image": "chattts-runtime:test",
                     "upstream_data_interval_seconds": "0"}


def apply(kubectl, namespace: str, *objs: dict[str, Any]) -> None:
    kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                    "items": list(objs)}))


def get(kubectl, namespace: str, *args: str) -> Any:
    return json.loads(kubectl("get", "-n", namespace, *args, "-o", "json").stdout)


def kube_list(kubectl, namespace: str, kinds: str, *selector: str) -> list[dict[str, Any]]:
    out = kubectl("get", kinds, "-n", namespace, *selector, "-o", "json", timeout=120).stdout
    return json.loads(out)["items"]


def converged(obj: dict[str, Any]) -> bool:
    """Status written for the object's current generation, rolled out, and settled."""
    st = obj.get("status") or {}
    gen = obj["metadata"]["generation"]
    want = "ScaledToZero" if obj["spec"]["replicas"] == 0 else "Ready"
    return (st.get("observedGeneration") == gen and st.get("appliedGeneration") == gen
            and st.get("phase") == want and st.get("readyReplicas", 0) == obj["spec"]["replicas"])


def _desired(obj: dict[str, Any]) -> Desired:
    return desired_state(obj, parse_spec(obj), OperatorSettings(), largest_node_gpu_mib=None)


def expected_config_hash(obj: dict[str, Any]) -> str:
    """What the operator's own pure builders say the Deployment's config hash must be."""
    return _desired(obj).config_hash


def expected_configmap_name(obj: dict[str, Any]) -> str:
    """The runtime ConfigMap's name for the object's spec (content-addressed: <name>-runtime-<hash>)."""
    return _desired(obj).configmap["metadata"]["name"]


def runtime_configmap(kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The runtime ConfigMap that ChatTTSDeployment ``name``'s Deployment mounts now."""
    return get(kubectl, namespace, "configmap", mounted_configmap(get(kubectl, namespace, "deploy", name)))


def runtime_yaml(kubectl, namespace: str, name: str) -> str:
    """The runtime config (YAML text) that ChatTTSDeployment ``name``'s pods are given now."""
    return runtime_configmap(kubectl, namespace, name)["data"][CONFIG_KEY]
