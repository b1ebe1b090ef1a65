"""The chart against the real local control plane: the rendered objects pass the API server's
validation and admission, and a release installs (operator pod Ready; kwok plays the kubelet,
so no container runs), upgrades and uninstalls cleanly (CRDs stay)."""
from __future__ import annotations

import json
import secrets
import time

import pytest
import yaml

from conftest import CHART, Helm

pytestmark = pytest.mark.helm

INSTANCE_LABEL = "app.kubernetes.io/instance"
CRD_NAMES = sorted(yaml.safe_load(p.read_text())["metadata"]["name"] for p in (CHART / "files" / "crds").glob("*.yaml"))


def adopt_existing_crds(cluster, release: str, namespace: str) -> None:
    """Let this release take over CRDs that other tests (or a previous release) applied.

    Helm refuses to install over objects it does not own; these annotations and label are
    Helm's documented way to hand existing objects to a release (as an admin would when the
    CRDs were first applied with kubectl)."""
    for name in CRD_NAMES:
        if cluster.kubectl("get", "crd", name, check=False).returncode != 0:
            continue
        cluster.kubectl("annotate", "--overwrite", "crd", name,
                        f"meta.helm.sh/release-name={release}", f"meta.helm.sh/release-namespace={namespace}")
        cluster.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")


@pytest.fixture
def release(cluster, namespace):
    name = f"op-{secrets.token_hex(3)}"
    yield name
    cluster.helm("uninstall", name, "-n", namespace, "--wait", "--timeout", "2m", check=False)


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_rendered_chart_is_accepted_by_the_api_server(cluster, namespace, helm: Helm, mode):
    values = {"dashboard": {"enabled": True}, "priorityClassName": "system-cluster-critical",
              "operator": {"logLevel": "debug"}}
    if mode == "namespaced":
        values["watchNamespaces"] = [namespace, "default"]
    rendered = helm.template(values, release="dry", namespace=namespace).stdout
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered) if doc}
    assert {"CustomResourceDefinition", "Deployment", "ClusterRole", "ConfigMap"} <= kinds
    # The operator pod meets the "restricted" Pod Security Standard: the API server's PodSecurity
    # admission warns about a Deployment whose pods would violate it.
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/warn=restricted")
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered)
    assert "(server dry run)" in result.stdout
    assert "PodSecurity" not in result.stderr, result.stderr
    # Nothing was written.
    assert cluster.kubectl("get", "deployment", "-n", namespace, "-l", f"{INSTANCE_LABEL}=dry",
                           "-o", "name").stdout.strip() == ""


def test_monitors_are_refused_without_the_prometheus_operator(cluster, namespace, helm: Helm):
    """Why they are off by default: without the monitoring.coreos.com CRDs the API server has no such kinds."""
    if cluster.kubectl("get", "crd", "servicemonitors.monitoring.coreos.com", check=False).returncode == 0:
        pytest.skip("this cluster has the Prometheus Operator CRDs")
    rendered = helm.template({"serviceMonitor": {"enabled": True}}, release="dry", namespace=namespace).stdout
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode != 0 and "ServiceMonitor" in result.stderr


def _operator_pod(cluster, namespace: str, release: str) -> dict:
    pods = cluster.kubectl_json("get", "pods", "-n", namespace, "-l", f"{INSTANCE_LABEL}={release}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    assert len(live) == 1, [p["metadata"]["name"] for p in pods]
    return live[0]


def _wait_for(predicate, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _env(deployment: dict) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def _release_objects(cluster, namespace: str, release: str) -> list[str]:
    selector = f"{INSTANCE_LABEL}={release}"
    namespaced = cluster.kubectl(
        "get", "deployments,replicasets,pods,services,serviceaccounts,configmaps,roles,rolebindings",
        "-n", namespace, "-l", selector, "-o", "name").stdout.split()
    cluster_scoped = cluster.kubectl("get", "clusterroles,clusterrolebindings", "-l", selector,
                                     "-o", "name").stdout.split()
    return namespaced + cluster_scoped


def test_install_upgrade_uninstall(cluster, namespace, release):
    adopt_existing_crds(cluster, release, namespace)
    # install: CRDs, RBAC and the operator; --wait returns once the Deployment is available.
    cluster.helm("install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "3m",
                 "--set", "dashboard.enabled=true")
    for name in CRD_NAMES:
        crd = cluster.kubectl_json("get", "crd", name)
        assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True"
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    pod = _operator_pod(cluster, namespace, release)
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    deployment = cluster.kubectl_json("get", "deployment", "-n", namespace, "-l", f"{INSTANCE_LABEL}={release}")["items"][0]
    assert _env(deployment)["CHATTTS_OPERATOR_GPU_PROFILE"] == "gpu-memory"
    first_pod_uid = pod["metadata"]["uid"]

    # upgrade with a changed value: the Deployment changes and its pod is replaced (Recreate).
    cluster.helm("upgrade", release, str(CHART), "-n", namespace, "--wait", "--timeout", "3m",
                 "--set", "dashboard.enabled=true", "--set", "gpu.sharingProfile=hami")
    deployment = cluster.kubectl_json("get", "deployment", deployment["metadata"]["name"], "-n", namespace)
    assert _env(deployment)["CHATTTS_OPERATOR_GPU_PROFILE"] == "hami"
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    new_pod = _wait_for(lambda: (p := _operator_pod(cluster, namespace, release))["metadata"]["uid"] != first_pod_uid
                        and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                        and p, "the upgraded operator pod to be Ready")
    assert new_pod["metadata"]["uid"] != first_pod_uid
    history = json.loads(cluster.helm("history", release, "-n", namespace, "-o", "json").stdout)
    assert [h["revision"] for h in history] == [1, 2] and history[-1]["status"] == "deployed"
    assert _release_objects(cluster, namespace, release)

    # uninstall: every object of the release goes; the CRDs (and so users' resources) stay.
    cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout", "2m")
    _wait_for(lambda: not _release_objects(cluster, namespace, release), "the release's objects to be deleted")
    for name in CRD_NAMES:
        assert cluster.kubectl("get", "crd", name, check=False).returncode == 0, f"{name} was deleted"
    assert cluster.helm("status", release, "-n", namespace, check=False).returncode != 0
