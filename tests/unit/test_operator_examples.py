"""Every ChatTTSDeployment in deploy/examples is valid; the unsatisfiable ones are blocked."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from chattts_operator.deployment.spec import desired_state, parse_spec
from chattts_operator.core.settings import OperatorSettings

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
SETTINGS = OperatorSettings(mig_profiles=("1g.18gb", "2g.35gb", "3g.71gb"))
H200_MIB = 143771


def ctds(path: Path):
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "ChatTTSDeployment":
            doc["metadata"].update(namespace="default", uid="u", generation=1)
            yield doc


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("chattts-*.yaml")), ids=lambda p: p.stem)
def test_examples_fit(path):
    found = list(ctds(path))
    assert found
    for body in found:
        desired = desired_state(body, parse_spec(body), SETTINGS, largest_node_gpu_mib=H200_MIB)
        assert desired.rollout_allowed, desired.capacity.message


@pytest.mark.parametrize("path", sorted((EXAMPLES / "unsatisfiable").glob("*.yaml")), ids=lambda p: p.stem)
def test_unsatisfiable_examples_are_blocked(path):
    for body in ctds(path):
        desired = desired_state(body, parse_spec(body), SETTINGS, largest_node_gpu_mib=H200_MIB)
        assert not desired.rollout_allowed
