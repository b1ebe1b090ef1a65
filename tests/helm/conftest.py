"""Helpers for the chart tests: the helm binary (built by hack/cluster/build.sh) and rendering."""
from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import localcluster

REPO = Path(__file__).resolve().parents[2]
# CHATTTS_CHART_DIR: test another copy of the chart (a packaged release, or a modified one).
CHART = Path(os.environ.get("CHATTTS_CHART_DIR") or REPO / "deploy" / "helm" / "chattts-operator")
# The control plane's version: `helm template` otherwise assumes an old default and the
# chart's kubeVersion constraint refuses it.
KUBE_VERSION = localcluster.read_versions()["KUBERNETES_VERSION"]


@dataclass
class Helm:
    binary: Path
    home: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ,
               "HELM_CONFIG_HOME": str(self.home / "config"),
               "HELM_CACHE_HOME": str(self.home / "cache"),
               "HELM_DATA_HOME": str(self.home / "data")}
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def template(self, values: dict[str, Any] | None = None, *, release: str = "tts",
                 namespace: str = "chattts-system", check: bool = True,
                 values_dir: Path | None = None) -> subprocess.CompletedProcess:
        args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
        if values is not None:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=values_dir or self.home, delete=False) as f:
                yaml.safe_dump(values, f)
            args += ["--values", f.name]
        return self.run(*args, check=check)

    def render(self, values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        """The chart's objects for these values (parsed; empty documents dropped)."""
        return [doc for doc in yaml.safe_load_all(self.template(values, **kwargs).stdout) if doc]


@pytest.fixture(scope="session")
def helm_binary() -> Path:
    binary = localcluster.default_bin_dir() / "helm"
    if not os.access(binary, os.X_OK):
        message = f"helm missing at {binary}: run hack/cluster/build.sh or set CHATTTS_CLUSTER_BIN_DIR"
        if os.environ.get("CHATTTS_REQUIRE_CLUSTER"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


@pytest.fixture(scope="session")
def helm(helm_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary, tmp_path_factory.mktemp("helm-home"))


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]
