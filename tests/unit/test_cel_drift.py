"""Drift between the CRDs' CEL rules and the operator's models, without a cluster: every rule
the generated CRDs carry has a case in tests/unit/cel_cases.py, and the models accept each
case's good value and refuse its bad one (tests/cluster/test_cel_drift_api_server.py asks the API server
the same questions)."""
from __future__ import annotations

from typing import Any, Iterator

import pytest
from pydantic import ValidationError

from chattts_operator.api.sharepolicy import GPUSharePolicy
from chattts_operator.crdgen import build_crd
from chattts_operator.api import CRD_KINDS
from chattts_operator.deployment.spec import InvalidSpec, parse_spec
from tests.unit.cel_cases import CASES, CTD, CelCase, case_object


def cel_rules() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind, schema path, rule) for every x-kubernetes-validations entry of both CRDs."""
    def walk(kind: str, node: Any, path: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
        if not isinstance(node, dict):
            return
        for rule in node.get("x-kubernetes-validations") or []:
            yield kind, path, rule
        for name, sub in (node.get("properties") or {}).items():
            yield from walk(kind, sub, f"{path}.{name}" if path else name)
        if "items" in node:
            yield from walk(kind, node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk(kind, node["additionalProperties"], f"{path}.*")

    for kind in CRD_KINDS:
        schema = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        yield from walk(kind.kind, schema, "")


def models_accept(obj: dict[str, Any]) -> bool:
    """Whether the operator's models take the object (a ChatTTSDeployment as the reconciler
    parses it, a GPUSharePolicy whole, status included)."""
    try:
        if obj["kind"] == CTD:
            parse_spec(obj)
        else:
            GPUSharePolicy.model_validate({k: v for k, v in obj.items() if k in ("spec", "status")})
    except (InvalidSpec, ValidationError, ValueError):
        return False
    return True


def test_every_cel_rule_of_both_crds_has_a_case():
    rules = list(cel_rules())
    assert len(rules) >= 60
    missing = [(kind, path, rule["message"]) for kind, path, rule in rules
               if not any(c.kind == kind and c.path == path and c.message in rule["message"] for c in CASES)]
    assert not missing, "CEL rules without a drift case in tests/unit/cel_cases.py:\n" + "\n".join(map(str, missing))


def test_every_case_names_a_rule_that_exists():
    rules = list(cel_rules())
    stale = [c.id for c in CASES
             if not any(c.kind == kind and c.path == path and c.message in rule["message"] for kind, path, rule in rules)]
    assert not stale


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_models_agree_with_the_rule(case: CelCase):
    assert models_accept(case_object(case, "good")), f"the models refuse the good value of {case.id}"
    assert not models_accept(case_object(case, "bad")), f"the models accept the bad value of {case.id}"
