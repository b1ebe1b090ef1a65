"""The operator image, as the chart runs it, reconciles a sample against the local control plane.

The chart's CRDs and RBAC are applied (namespaced install: it watches the test's namespace), the
container authenticates with a TokenRequest token of the chart's ServiceAccount, runs with the
chart's arguments and environment, and turns the sample ChatTTSDeployment into its Deployment.
"""
from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import localcluster
from conftest import REPO, free_port, wait_for_http
from tests.support import apply_chart_identity, token_kubeconfig

pytestmark = [pytest.mark.images, pytest.mark.cluster]

CHART = REPO / "deploy" / "helm" / "chattts-operator"
SAMPLE = REPO / "deploy" / "examples" / "chattts-hami-hostpath.yaml"
RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def render_chart(release: str, namespace: str) -> list[dict]:
    helm = localcluster.default_bin_dir() / "helm"
    if not helm.exists():
        pytest.fail(f"helm missing at {helm}: run hack/cluster/build.sh")
    kube_version = localcluster.read_versions()["KUBERNETES_VERSION"]
    rendered = subprocess.run([str(helm), "template", release, str(CHART), "--namespace", namespace,
                               "--kube-version", kube_version, "--set", f"watchNamespaces={{{namespace}}}"],
                              capture_output=True, text=True, check=True, timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def test_operator_image_reconciles_a_sample_under_the_chart_identity(cluster, namespace, operator_image,
                                                                      run_container, tmp_path):
    objects = render_chart(f"img-{secrets.token_hex(3)}", namespace)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container_spec,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    rbac = apply_chart_identity(cluster, objects, RBAC_KINDS)
    try:
        token = cluster.kubectl("create", "token", pod["serviceAccountName"], "-n", namespace,
                                "--duration=1h").stdout.strip()
        kubeconfig = token_kubeconfig(Path(cluster.kubeconfig), token, tmp_path / "identity" / "kubeconfig",
                                      mode=0o644)
        kubeconfig.parent.chmod(0o755)
        health_port, metrics_port = free_port(), free_port()
        # The chart's arguments, with the liveness endpoint on a free loopback port (host network).
        args = [f"--liveness=http://127.0.0.1:{health_port}/healthz" if a.startswith("--liveness=") else a
                for a in container_spec["args"]]
        env = {e["name"]: e["value"] for e in container_spec["env"] if "value" in e}
        env.update(KUBECONFIG="/etc/chattts/kubeconfig", CHATTTS_OPERATOR_METRICS_PORT=str(metrics_port))
        container = run_container(operator_image, *args, options=[
            f"--volume={kubeconfig}:/etc/chattts/kubeconfig:ro", *[f"--env={k}={v}" for k, v in env.items()]])
        wait_for_http(f"http://127.0.0.1:{health_port}/healthz", container, timeout=120)

        # The sample is its API-key Secret and the ChatTTSDeployment that names it.
        cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
        sample = next(d for d in yaml.safe_load_all(SAMPLE.read_text()) if d and d["kind"] == "ChatTTSDeployment")
        name = sample["metadata"]["name"]
        deadline = time.monotonic() + 120
        while True:
            found = json.loads(cluster.kubectl(
                "get", "deployments", "-n", namespace, "-o", "json", "-l",
                f"app.kubernetes.io/managed-by=chattts-operator,app.kubernetes.io/instance={name}").stdout)["items"]
            status = json.loads(cluster.kubectl("get", "ctd", name, "-n", namespace, "-o", "json").stdout).get(
                "status", {})
            if found and status.get("observedGeneration") == 1:
                break
            assert container.running(), f"the operator container exited:\n{container.logs()[-4000:]}"
            assert time.monotonic() < deadline, f"no Deployment/status for {name}:\n{container.logs()[-4000:]}"
            time.sleep(1)
        limits = found[0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpumem"] == "16384" and limits["nvidia.com/gpu"] == "1"
        metrics = wait_for_http(f"http://127.0.0.1:{metrics_port}/metrics", container, timeout=30).decode()
        assert "chattts" in metrics
        assert "Forbidden" not in container.logs(), "the chart's identity was refused a request"
    finally:
        for obj in rbac:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found",
                                check=False)
