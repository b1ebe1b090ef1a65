"""Drift between the CRDs' CEL rules and the operator's models, on the real API server: for
every rule of both CRDs (tests/unit/cel_cases.py, which tests/unit/test_cel_drift.py proves
covers them all), the API server accepts the good value and refuses the bad one with the
rule's message, exactly as the models do. Server-side dry runs: nothing is stored, except
for the status rule (a status write needs the object)."""
from __future__ import annotations

import pytest

from tests.unit.cel_cases import CASES, CTD, CelCase, case_object
from tests.unit.test_cel_drift import models_accept

SPEC_CASES = [c for c in CASES if not c.path.startswith("status")]
STATUS_CASES = [c for c in CASES if c.path.startswith("status")]


def _collection(kind: str, namespace: str) -> str:
    if kind == CTD:
        return f"/apis/tts.chattts.io/v1alpha1/namespaces/{namespace}/chattsdeployments"
    return "/apis/tts.chattts.io/v1alpha1/gpusharepolicies"


def _message(body) -> str:
    return body.get("message", "") if isinstance(body, dict) else str(body)


@pytest.mark.parametrize("case", SPEC_CASES, ids=[c.id for c in SPEC_CASES])
def test_api_server_and_models_agree(crds, namespace, case: CelCase):
    for which in ("good", "bad"):
        obj = case_object(case, which)
        status, body = crds.api("POST", f"{_collection(case.kind, namespace)}?dryRun=All", obj)
        accepted = status == 201
        assert accepted == models_accept(obj), (which, status, _message(body))
        assert accepted == (which == "good"), (which, status, _message(body))
        if not accepted:
            assert status == 422 and case.api_message in _message(body), _message(body)


@pytest.mark.parametrize("case", STATUS_CASES, ids=[c.id for c in STATUS_CASES])
def test_status_rules_agree(crds, namespace, case: CelCase):
    name = f"drift-{namespace}"
    obj = case_object(case, "good", name)
    status, body = crds.api("POST", _collection(case.kind, namespace), {k: v for k, v in obj.items() if k != "status"})
    assert status == 201, body
    try:
        for which in ("good", "bad"):
            obj = case_object(case, which, name)
            status, body = crds.api("PATCH", f"{_collection(case.kind, namespace)}/{name}/status",
                                    {"status": obj["status"]}, "application/merge-patch+json")
            assert (status == 200) == models_accept(obj) == (which == "good"), (which, status, _message(body))
            if which == "bad":
                assert case.api_message in _message(body)
    finally:
        crds.api("DELETE", f"{_collection(case.kind, namespace)}/{name}")
