"""Chart files that must stay in step with the code (no helm needed)."""
from __future__ import annotations

import json
import re

import yaml

from conftest import CHART, REPO

GENERATED_CRDS = REPO / "deploy" / "crds"
CHART_CRDS = CHART / "files" / "crds"


def test_chart_crds_are_the_generated_ones():
    generated = {p.name: p.read_bytes() for p in GENERATED_CRDS.glob("*.yaml")}
    copied = {p.name: p.read_bytes() for p in CHART_CRDS.glob("*.yaml")}
    assert generated, "deploy/crds is empty: run python -m chattts_operator.crdgen"
    assert copied == generated, (
        "the chart's CRDs differ from deploy/crds: run deploy/helm/chattts-operator/hack/sync-crds.sh")


def test_values_schema_forbids_unknown_keys_everywhere():
    """Every object in the schema either lists its keys (typos fail) or is a free-form k8s block."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    free_form = {"global", "affinity", "podSecurityContext", "securityContext", "requests", "limits", "valueFrom"}

    def walk(node, path):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}")
        elif node.get("type") == "object":
            assert path.rsplit(".", 1)[-1] in free_form or "additionalProperties" in node, path
        elif node.get("type") == "array":
            walk(node.get("items", {}), f"{path}[]")

    walk(schema, "values")


def test_every_default_value_is_described_by_the_schema():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(value, node, path):
        if isinstance(value, dict) and "properties" in node:
            for key, child in value.items():
                assert key in node["properties"], f"{path}.{key} is in values.yaml but not in the schema"
                walk(child, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "values")


def _exposed_series_names(registry) -> set[str]:
    """The series names a registry exposes, whether or not a labelled child exists yet."""
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                "gauge": ("",), "summary": ("", "_count", "_sum", "_created")}
    return {family.name + suffix for family in registry.collect() for suffix in suffixes.get(family.type, ("",))}


def test_dashboard_only_queries_metrics_the_code_exports():
    from chattts_operator.core.metrics import REGISTRY as OPERATOR_REGISTRY
    from chattts_runtime.metrics import RuntimeMetrics

    known = _exposed_series_names(OPERATOR_REGISTRY) | _exposed_series_names(RuntimeMetrics().registry)
    known.add("up")  # Prometheus' own per-target series
    dashboard = json.loads((CHART / "files" / "dashboards" / "chattts.json").read_text())
    expressions = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    expressions += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    assert expressions
    used = set()
    for expr in expressions:
        # Series names: identifiers directly followed by a selector, a range or a closing parenthesis,
        # minus PromQL functions and label names.
        for name in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=[{\[)])", expr):
            if name not in PROMQL_WORDS:
                used.add(name)
    assert used, expressions
    assert used <= known, f"dashboard queries unknown metrics: {sorted(used - known)}"
    # Every panel groups serving series by the label the PodMonitor adds.
    podmonitor = (CHART / "templates" / "podmonitor.yaml").read_text()
    assert "targetLabel: chattts_deployment" in podmonitor


PROMQL_WORDS = {"sum", "rate", "count", "histogram_quantile", "label_values", "max", "min", "avg",
                "namespace", "chattts_deployment", "le", "result", "status"}
