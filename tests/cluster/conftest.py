"""Fixtures of the cluster tier (the session cluster and ``namespace`` are in tests/conftest.py).

- ``crds`` (per module): the generated CRDs installed on the session cluster; the cluster.
- ``operators``: a factory of operator subprocesses (``bench.operator_scale.operatorproc``,
  ``python -m chattts_operator run``) watching the test's namespace; all stopped at the end,
  their log tails printed (pytest shows them when the test fails).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from bench.operator_scale.operatorproc import OperatorProcess
from tests.cluster.helpers import OPERATOR_SETTINGS
from tests.support import install_crds


@pytest.fixture(scope="module")
def crds(cluster):
    install_crds(cluster)
    return cluster


@pytest.fixture
def operators(crds, namespace: str, tmp_path: Path) -> Iterator:
    made: list[OperatorProcess] = []

    def make(**settings: str) -> OperatorProcess:
        op = OperatorProcess(crds.kubeconfig, tmp_path, namespaces=(namespace,), **{**OPERATOR_SETTINGS, **settings})
        made.append(op)
        return op

    yield make
    for op in made:
        op.stop()
        print(f"--- operator log ({op.log_path.name}) ---\n{op.log_tail(60)}")
