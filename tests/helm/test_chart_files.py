"""Chart files that must stay in step with the code (no helm needed)."""
from __future__ import annotations

import json

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
