"""The chart's RBAC, proven on the real API server.

Sufficient: the operator runs in-process (kopf's KopfRunner) authenticated as the chart's
ServiceAccount, with a token from the TokenRequest API, through a full create / update /
delete of a ChatTTSDeployment, with no request refused (kopf degrades quietly on some 403s,
so its log is checked too). Minimal where it matters: that identity cannot read Secrets,
delete Nodes, create Pods, grant itself more, or touch namespaces it does not watch.
"""
from __future__ import annotations

import logging
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import REPO, Helm

pytestmark = pytest.mark.helm

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
EXAMPLE = REPO / "deploy" / "examples" / "chattts-hami-hostpath.yaml"
EXAMPLE_NAME = "chattts-hami"
INSTANCE_LABEL = "app.kubernetes.io/instance"


@dataclass
class Identity:
    release: str
    namespace: str
    service_account: str
    kubeconfig: Path
    env: dict[str, str]  # the operator settings the chart gives the operator
    watch_namespaces: list[str]

    def kubectl(self, cluster, *args: str, check: bool = False):
        """kubectl as the operator's ServiceAccount."""
        return cluster.kubectl("--kubeconfig", str(self.kubeconfig), *args, check=check)

    def can_i(self, cluster, *args: str) -> bool:
        result = self.kubectl(cluster, "auth", "can-i", *args)
        return result.stdout.strip() == "yes"


def _token_kubeconfig(cluster, token: str, path: Path) -> Path:
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster_entry = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster_entry["cluster"]}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
        "current-context": "operator",
    }))
    path.chmod(0o600)
    return path


@pytest.fixture(params=["cluster-wide", "namespaced"])
def identity(request, cluster, namespace, helm: Helm, tmp_path) -> Iterator[Identity]:
    """The chart's ServiceAccount and RBAC (nothing else of the chart) applied, and a token for it."""
    release = f"rbac-{secrets.token_hex(3)}"
    watch = [namespace] if request.param == "namespaced" else []
    objects = helm.render({"watchNamespaces": watch}, release=release, namespace=namespace)
    rbac = [o for o in objects if o["kind"] in RBAC_KINDS]
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    # The CRDs as the chart ships them (an admin's job, not the operator's).
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "--field-manager=chattts-tests", "-f", "-",
                    input=yaml.safe_dump_all(crds))
    for crd in crds:
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    try:
        token = cluster.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()
        kubeconfig = _token_kubeconfig(cluster, token, tmp_path / "operator.kubeconfig")
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        yield Identity(release, namespace, service_account, kubeconfig, env, watch)
    finally:
        for obj in rbac:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found",
                                check=False)


@contextmanager
def operator_running_as(identity: Identity, monkeypatch, expect_clean_exit: bool = True) -> Iterator[object]:
    """The real operator (all its handlers) in this process, authenticated as the identity."""
    import kubernetes.config.kube_config
    import kubernetes_asyncio.config.kube_config
    from kopf.testing import KopfRunner

    import chattts_operator.handlers.sharepolicy as sharepolicy_handlers

    # Both clients read KUBECONFIG once, at import; point them (and kopf's login) at the token.
    monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(identity.kubeconfig))
    monkeypatch.setattr(kubernetes_asyncio.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION",
                        str(identity.kubeconfig))
    monkeypatch.setattr(sharepolicy_handlers, "_config_loaded", False, raising=False)
    for name, value in identity.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CHATTTS_OPERATOR_METRICS_PORT", "0")  # any free port
    scope = [f"--namespace={ns}" for ns in identity.watch_namespaces] or ["--all-namespaces"]
    with KopfRunner(["run", "--standalone", "--verbose", "-m", "chattts_operator.handlers", *scope],
                    timeout=120) as runner:
        yield runner
    if expect_clean_exit:
        assert runner.exception is None, runner.exception
        assert runner.exit_code == 0, runner.output


def _wait_for(predicate, what: str, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _children(cluster, namespace: str) -> list[dict]:
    return cluster.kubectl_json("get", "deployments", "-n", namespace, "-l", f"{INSTANCE_LABEL}={EXAMPLE_NAME}")["items"]


def _ready_replicas(cluster, namespace: str) -> int:
    ctd = cluster.kubectl_json("get", "ctd", EXAMPLE_NAME, "-n", namespace)
    status = ctd.get("status") or {}
    if status.get("observedGeneration") != ctd["metadata"]["generation"]:
        return -1
    return int(status.get("readyReplicas") or 0)


def test_operator_reconciles_a_full_lifecycle_under_the_chart_identity(cluster, identity, monkeypatch, caplog):
    ns = identity.namespace
    caplog.set_level(logging.INFO)
    with operator_running_as(identity, monkeypatch):
        # create: children appear, pods run (kwok), status is written.
        cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
        (deployment,) = _wait_for(lambda: _children(cluster, ns), "the serving Deployment")
        assert deployment["spec"]["replicas"] == 1
        pod_spec = deployment["spec"]["template"]["spec"]
        limits = pod_spec["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpumem"] == "16384" and limits["nvidia.com/gpu"] == "1"
        _wait_for(lambda: _ready_replicas(cluster, ns) == 1, "status.readyReplicas == 1")

        # update: the change reaches the Deployment and the status follows.
        cluster.kubectl("patch", "ctd", EXAMPLE_NAME, "-n", ns, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
        _wait_for(lambda: _children(cluster, ns)[0]["spec"]["replicas"] == 2, "the Deployment to scale to 2")
        _wait_for(lambda: _ready_replicas(cluster, ns) == 2, "status.readyReplicas == 2")

        # delete: completes (any finalizer of the operator is released) and the children go with it.
        cluster.kubectl("delete", "ctd", EXAMPLE_NAME, "-n", ns, "--wait=true", "--timeout=60s")
        _wait_for(lambda: not _children(cluster, ns), "the garbage collector to remove the Deployment")

    refused = [r.getMessage() for r in caplog.records
               if any(word in r.getMessage() for word in ("403", "Forbidden", "forbidden", "Not enough permissions"))]
    assert not refused, "the operator was refused:\n" + "\n".join(refused)


def test_operator_without_its_bindings_is_refused(cluster, identity, monkeypatch, caplog):
    """Control for the test above: the operator really runs as the ServiceAccount (not as the
    admin of the test cluster), so without the chart's bindings it is refused."""
    selector = f"{INSTANCE_LABEL}={identity.release}"
    cluster.kubectl("delete", "clusterrolebindings", "-l", selector)
    cluster.kubectl("delete", "rolebindings", "-A", "-l", selector)
    caplog.set_level(logging.INFO)
    with operator_running_as(identity, monkeypatch, expect_clean_exit=False):
        _wait_for(lambda: any("403" in r.getMessage() or "orbidden" in r.getMessage() for r in caplog.records),
                  "the operator's first refused request", timeout=60)


def test_identity_cannot_do_what_it_should_not(cluster, identity):
    ns = identity.namespace
    can = lambda *args: identity.can_i(cluster, *args)  # noqa: E731

    # It can do its job...
    assert can("patch", "chattsdeployments.tts.chattts.io", "-n", ns)
    assert can("create", "deployments.apps", "-n", ns)
    assert can("patch", "chattsdeployments.tts.chattts.io", "--subresource=scale", "-n", ns)
    # ...and nothing that would let it read credentials, break nodes or escalate.
    for args in (
        ("get", "secrets", "-n", "kube-system"),
        ("list", "secrets", "-A"),
        ("get", "secrets", "-n", ns),
        ("delete", "nodes"),
        ("patch", "nodes"),
        ("create", "pods", "-n", ns),
        ("create", "pods", "--subresource=exec", "-n", ns),
        ("create", "serviceaccounts", "--subresource=token", "-n", ns),
        ("delete", "deployments.apps", "-n", ns),
        ("delete", "chattsdeployments.tts.chattts.io", "-n", ns),
        ("delete", "customresourcedefinitions"),
        ("create", "clusterrolebindings"),
        ("escalate", "clusterroles"),
        ("bind", "clusterroles"),
        ("impersonate", "users"),
        ("delete", "priorityclasses.scheduling.k8s.io"),
        ("get", "priorityclasses.scheduling.k8s.io/system-node-critical"),
    ):
        assert not can(*args), f"the operator's identity may {' '.join(args)}"
    if identity.watch_namespaces:
        assert not can("patch", "chattsdeployments.tts.chattts.io", "-n", "default")
        assert not can("create", "deployments.apps", "-n", "default")
        assert not can("list", "pods", "-A")

    # Real requests, not only the authorizer's answer.
    refused = identity.kubectl(cluster, "get", "secrets", "-n", "kube-system")
    assert refused.returncode != 0 and "Forbidden" in refused.stderr
    node = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
    refused = identity.kubectl(cluster, "delete", "node", node, "--dry-run=server")
    assert refused.returncode != 0 and "Forbidden" in refused.stderr
