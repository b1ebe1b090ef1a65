"""The CRDs in deploy/crds/ are generated from the models and are structural."""
from __future__ import annotations

from typing import Any

import pytest
import yaml

from chattts_operator import crdgen
from chattts_operator.api import CHATTTS_DEPLOYMENT, CRD_KINDS
from chattts_operator.crdgen import SchemaError, _structural


def test_committed_crds_match_the_models():
    for path, text in crdgen.generate().items():
        assert path.exists(), f"{path} missing: run python -m chattts_operator.crdgen"
        assert path.read_text() == text, f"{path} drifted from the models: run python -m chattts_operator.crdgen"


def test_check_mode_reports_drift(tmp_path):
    assert crdgen.main(["--out-dir", str(tmp_path), "--check"]) == 1
    assert crdgen.main(["--out-dir", str(tmp_path)]) == 0
    assert crdgen.main(["--out-dir", str(tmp_path), "--check"]) == 0
    first = next(tmp_path.glob("*.yaml"))
    first.write_text(first.read_text() + "# edited\n")
    assert crdgen.main(["--out-dir", str(tmp_path), "--check"]) == 1


def _walk(node: Any, path: str = ""):
    yield path, node
    for key in ("properties",):
        for name, sub in (node.get(key) or {}).items():
            yield from _walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


@pytest.mark.parametrize("kind", CRD_KINDS, ids=[k.kind for k in CRD_KINDS])
def test_schema_is_structural(kind):
    schema = crdgen.build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "type" in node, f"{kind.kind}{path}: no type"
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "title", "const", "$defs"):
            assert banned not in node, f"{kind.kind}{path}: {banned}"
        if "properties" in node:
            assert "additionalProperties" not in node, f"{kind.kind}{path}: additionalProperties beside properties"
        if node.get("exclusiveMinimum") is not None:
            assert isinstance(node["exclusiveMinimum"], bool)
        assert node.get("default", 0) is not None, f"{kind.kind}{path}: default null"


def test_chattts_crd_names_columns_and_subresources():
    crd = crdgen.build_crd(CHATTTS_DEPLOYMENT)
    assert crd["metadata"]["name"] == "chattsdeployments.tts.chattts.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("ChatTTSDeployment", "chattsdeployments", ["ctd"])
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Ready", "Desired", "GPU", "Phase", "Age"]
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["model", "gpu"]
    engine = spec["properties"]["engine"]
    assert engine["default"] == {}
    util = engine["properties"]["gpuMemoryUtilization"]
    assert (util["minimum"], util["exclusiveMinimum"], util["maximum"], util["default"]) == (0.0, True, 1.0, 0.85)
    assert engine["properties"]["speculativeConfig"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["properties"]["model"]["properties"]["format"]["enum"] == ["awq", "compressed-tensors", "fp16"]
    assert "exactly one weight source" in spec["properties"]["model"]["x-kubernetes-validations"][0]["message"]
    assert any("metadata.name" in r["rule"] for r in schema["x-kubernetes-validations"])
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]
    # Every spec field is documented for `kubectl explain`.
    for path, node in _walk(spec):
        if path and not path.endswith(("]", ".*")):
            assert node.get("description"), f"spec{path} has no description"
    assert schema["properties"]["status"].get("nullable") is None


def test_yaml_round_trips():
    for text in crdgen.generate().values():
        assert yaml.safe_load(text)["kind"] == "CustomResourceDefinition"


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "union of 2 types"),
        ({"oneOf": [{"type": "string"}]}, "oneOf"),
        ({"$ref": "#/$defs/Missing"}, "unresolvable"),
        ({"type": ["string", "integer"]}, "list of types"),
    ],
)
def test_unsupported_constructs_fail_loudly(schema, message):
    with pytest.raises(SchemaError, match=message):
        _structural(schema, {}, "X")


@pytest.mark.parametrize(
    "schema, expected",
    [
        ({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}, {"type": "integer", "nullable": True}),
        ({"const": "a"}, {"enum": ["a"], "type": "string"}),
        ({"type": "number", "exclusiveMinimum": 0}, {"type": "number", "minimum": 0, "exclusiveMinimum": True}),
        ({"type": "object", "additionalProperties": {"type": "string"}},
         {"type": "object", "additionalProperties": {"type": "string"}}),
        ({"type": "object", "additionalProperties": True},
         {"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
        ({"type": "object", "properties": {"a": {"type": "string", "title": "A"}}, "additionalProperties": False},
         {"type": "object", "properties": {"a": {"type": "string"}}}),
        ({"$ref": "#/$defs/E", "description": "field doc"},
         {"type": "string", "enum": ["x"], "description": "field doc"}),
    ],
)
def test_transform_table(schema, expected):
    defs = {"E": {"type": "string", "enum": ["x"], "description": "enum doc", "title": "E"}}
    assert _structural(schema, defs, "X") == expected
