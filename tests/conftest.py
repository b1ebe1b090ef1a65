"""Session-wide fixtures: the real local control plane (hack/cluster/localcluster.py).

- ``cluster`` (session): a running cluster, started on first use. Its kubeconfig is
  exported as KUBECONFIG for the code under test. Stopped at the end of the
  session unless CHATTTS_KEEP_CLUSTER=1. With CHATTTS_TEST_KUBECONFIG set, that
  cluster is used as is (nothing started or stopped).
- ``namespace``: a fresh namespace per test (its ``default`` ServiceAccount exists), deleted after.
- ``kubectl``: ``kubectl(*args, input=None, check=True)`` bound to the cluster.

Tests using ``cluster`` are marked ``cluster`` automatically. Without the binaries
(hack/cluster/build.sh) they are skipped, unless CHATTTS_REQUIRE_CLUSTER is set
(CI), where that is an error.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import IO, Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
# Also on pytest's pythonpath (pyproject); repeated for runs from another rootdir.
if str(REPO / "hack" / "cluster") not in sys.path:
    sys.path.insert(0, str(REPO / "hack" / "cluster"))

import localcluster  # noqa: E402

SESSION_CLUSTER = os.environ.get("CHATTTS_TEST_CLUSTER_NAME", "pytest")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster_bin_dir() -> Path:
    """The control-plane binaries; skip (or fail under CHATTTS_REQUIRE_CLUSTER) when absent."""
    bin_dir = localcluster.default_bin_dir()
    missing = localcluster.missing_binaries(bin_dir)
    if missing:
        message = (f"local control-plane binaries missing in {bin_dir} ({', '.join(missing)}): "
                   "run hack/cluster/build.sh or set CHATTTS_CLUSTER_BIN_DIR")
        if os.environ.get("CHATTTS_REQUIRE_CLUSTER"):
            pytest.fail(message)
        pytest.skip(message)
    return bin_dir


def _try_lock(path: Path) -> IO | None:
    handle = open(path, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _claim_cluster_name(home: Path) -> tuple[str, IO]:
    """The session cluster's name, held by a lock for the whole session.

    Several pytest sessions may run at once in one checkout: the first takes the
    shared name (a kept cluster is reused), the others get a private one that is
    deleted at their end. Private clusters of sessions that died are removed here.
    """
    home.mkdir(parents=True, exist_ok=True)
    for lock_path in home.glob(f"{SESSION_CLUSTER}-*.session.lock"):
        orphan = _try_lock(lock_path)
        if orphan is not None:
            name = lock_path.name.removesuffix(".session.lock")
            with contextlib.suppress(localcluster.ClusterError):
                localcluster.LocalCluster(name, home=home).stop(purge=True)
            lock_path.unlink(missing_ok=True)
            orphan.close()
    for name in (SESSION_CLUSTER, f"{SESSION_CLUSTER}-{os.getpid()}"):
        handle = _try_lock(home / f"{name}.session.lock")
        if handle is not None:
            return name, handle
    raise RuntimeError(f"could not lock a cluster name under {home}")


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[localcluster.ClusterHandle]:
    external = os.environ.get("CHATTTS_TEST_KUBECONFIG")
    lock = None
    owned: localcluster.LocalCluster | None = None
    if external:
        handle = localcluster.LocalCluster.from_kubeconfig(external)
    else:
        bin_dir = request.getfixturevalue("cluster_bin_dir")
        home = localcluster.default_home()
        name, lock = _claim_cluster_name(home)
        owned = localcluster.LocalCluster(name, home=home, bin_dir=bin_dir)
        try:
            owned.start()
        except BaseException:
            lock.close()
            raise
        handle = owned
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(handle.kubeconfig)
    try:
        yield handle
    finally:
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous
        if owned is not None:
            private = owned.name != SESSION_CLUSTER
            if private or os.environ.get("CHATTTS_KEEP_CLUSTER") != "1":
                owned.stop(purge=private)
        if lock is not None:
            lock.close()


def _namespace_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{stem}-{secrets.token_hex(3)}"


def _default_service_account_exists(cluster: localcluster.ClusterHandle, namespace: str) -> bool:
    if isinstance(cluster, localcluster.LocalCluster):
        return cluster.api("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default")[0] == 200
    return cluster.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0


@pytest.fixture
def namespace(cluster: localcluster.ClusterHandle, request: pytest.FixtureRequest) -> Iterator[str]:
    name = _namespace_name(request.node.name)
    if isinstance(cluster, localcluster.LocalCluster):  # in process: no kubectl start-up per call
        status, body = cluster.api("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"chattts.io/test": "true"}}})
        if status != 201:
            raise RuntimeError(f"creating namespace {name} failed ({status}): {body}")
    else:
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl("label", "namespace", name, "chattts.io/test=true")
    # Pods are refused until the controller-manager has made the default ServiceAccount.
    deadline = time.monotonic() + 60
    while not _default_service_account_exists(cluster, name):
        if time.monotonic() > deadline:
            raise TimeoutError(f"ServiceAccount default never appeared in namespace {name}")
        time.sleep(0.1)
    try:
        yield name
    finally:
        # Not waited for: the namespace controller finishes the deletion in the background.
        if isinstance(cluster, localcluster.LocalCluster):
            cluster.api("DELETE", f"/api/v1/namespaces/{name}")
        else:
            cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.fixture
def kubectl(cluster: localcluster.ClusterHandle):
    return cluster.kubectl
