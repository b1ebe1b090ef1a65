"""The generated CRD on the real API server: accepted, explained, and the bad-input corpus
rejected at apply time with a message a user understands."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_operator_badinput import CORPUS, BadCase, bad_object, valid_object

REPO = Path(__file__).resolve().parents[2]
CRD_DIR = REPO / "deploy" / "crds"


def test_crd_is_established_with_columns_and_scale(crds):
    crd = crds.kubectl_json("get", "crd", "chattsdeployments.tts.chattts.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert conditions.get("NonStructuralSchema") in (None, "False")
    explained = " ".join(crds.kubectl("explain", "ctd.spec.engine").stdout.split())
    assert "gpuMemoryUtilization" in explained and "above 0.9 risks OOM" in explained


def test_valid_object_is_accepted_and_defaulted(crds, namespace):
    crds.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(valid_object("good")))
    obj = crds.kubectl_json("get", "ctd", "good", "-n", namespace)
    assert obj["spec"]["replicas"] == 1
    assert obj["spec"]["engine"]["gpuMemoryUtilization"] == 0.85
    assert obj["spec"]["model"]["shape"]["numLayers"] == 20
    printed = crds.kubectl("get", "ctd", "-n", namespace).stdout
    for column in ("READY", "DESIRED", "GPU", "PHASE", "AGE"):
        assert column in printed


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_bad_input_is_rejected_with_a_clear_message(crds, namespace, case: BadCase):
    obj = bad_object(case, name="bad")
    result = crds.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj), check=False)
    assert result.returncode != 0, f"{case.id} was accepted"
    assert case.api_message in result.stderr, result.stderr
    assert crds.kubectl("get", "ctd", obj["metadata"]["name"], "-n", namespace, check=False).returncode != 0


@pytest.mark.parametrize("example", sorted((REPO / "deploy" / "examples" / "unsatisfiable").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_unsatisfiable_examples_are_accepted(crds, namespace, example):
    crds.kubectl("apply", "-n", namespace, "-f", str(example))
