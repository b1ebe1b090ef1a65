"""Helpers shared by the cluster tier's modules: kubectl reads and writes, convergence checks."""
from __future__ import annotations

import json
from typing import Any

from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment.spec import desired_state, parse_spec

INSTANCE = "app.kubernetes.io/instance"
MANAGED = "app.kubernetes.io/managed-by=chattts-operator"
CHILD_KINDS = ("deployments", "configmaps", "services", "poddisruptionbudgets")
# Operator settings of the tests' operator processes: the MIG profiles the simulated nodes
# (hack/cluster) offer, and an image name no kubelet pulls.
OPERATOR_SETTINGS = {"mig_profiles": "1g.18gb,2g.35gb,3g.71gb", "runtime_image": "chattts-runtime:test"}


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


def expected_config_hash(obj: dict[str, Any]) -> str:
    """What the operator's own pure builders say the Deployment's config hash must be."""
    desired = desired_state(obj, parse_spec(obj), OperatorSettings(), largest_node_gpu_mib=None)
    return desired.config_hash
