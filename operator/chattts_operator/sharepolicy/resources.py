"""Nodes and label selectors, pure, over plain Kubernetes object dicts (camelCase). GPU
memory in MiB, whatever the sharing profile, is the deployment's codec (deployment/gpu.py):
a policy counts exactly what the deployment asked for."""
from __future__ import annotations

from typing import Any, Mapping

from chattts_operator.api.sharepolicy import LabelSelector


def node_is_usable(node: Mapping[str, Any]) -> bool:
    """Ready and schedulable: only such nodes count in the pool."""
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


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


def node_requirements(selector: LabelSelector) -> list[dict[str, Any]]:
    """The selector as node-affinity requirements (NodeSelectorRequirement: the same operators;
    matchLabels become In with one value), in a stable order."""
    out: list[dict[str, Any]] = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(selector.match_labels.items())]
    for req in selector.match_expressions:
        item: dict[str, Any] = {"key": req.key, "operator": req.operator}
        if req.operator in ("In", "NotIn"):
            item["values"] = sorted(req.values)
        out.append(item)
    return out
