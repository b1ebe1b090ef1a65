"""The chart's RBAC, proven on the real API server.

Sufficient: the operator runs in-process (kopf's KopfRunner) authenticated as the chart's
ServiceAccount, with a token from the TokenRequest API, through a full create / update /
delete of a ChatTTSDeployment, with no request refused (kopf degrades quietly on some 403s,
so its log is checked too). Minimal where it matters: that identity cannot read Secrets,
delete Nodes, create Pods, grant itself more, or touch namespaces it does not watch.
"""
from __future__ import annotations

import json
import logging
import re
import secrets
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import draslices
import pytest
import yaml

from conftest import Helm
from tests.support import apply_chart_identity, token_kubeconfig

pytestmark = pytest.mark.helm

RBAC_KINDS = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
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


@contextmanager
def _chart_identity(cluster, namespace, helm: Helm, tmp_path, watch: list[str],
                    values: dict | None = None) -> Iterator[Identity]:
    """The chart's ServiceAccount and RBAC (nothing else of the chart) applied, and a token for it."""
    release = f"rbac-{secrets.token_hex(3)}"
    objects = helm.render({"watchNamespaces": watch, **(values or {})}, release=release, namespace=namespace)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    # The CRDs as the chart ships them (an admin's job, not the operator's), then its RBAC.
    rbac = apply_chart_identity(cluster, objects, RBAC_KINDS)
    try:
        token = cluster.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()
        kubeconfig = token_kubeconfig(Path(cluster.kubeconfig), token, tmp_path / "operator.kubeconfig")
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        yield Identity(release, namespace, service_account, kubeconfig, env, watch)
    finally:
        for obj in rbac:
            if obj["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], "--ignore-not-found",
                                check=False)


@pytest.fixture(params=["cluster-wide", "namespaced"])
def identity(request, cluster, namespace, helm: Helm, tmp_path) -> Iterator[Identity]:
    watch = [namespace] if request.param == "namespaced" else []
    with _chart_identity(cluster, namespace, helm, tmp_path, watch) as made:
        yield made


@contextmanager
def operator_running_as(identity: Identity, monkeypatch, expect_clean_exit: bool = True) -> Iterator[object]:
    """The real operator (all its handlers) in this process, authenticated as the identity."""
    import kubernetes.config.kube_config
    import kubernetes_asyncio.config.kube_config
    from kopf.testing import KopfRunner

    # Both clients read KUBECONFIG once, at import; point them (and kopf's login) at the token.
    monkeypatch.setenv("KUBECONFIG", str(identity.kubeconfig))
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(identity.kubeconfig))
    monkeypatch.setattr(kubernetes_asyncio.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION",
                        str(identity.kubeconfig))
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


def _get(cluster, *args: str) -> dict:
    return cluster.kubectl_json("get", *args)


def _serving_deployments(cluster, namespace: str, name: str) -> list[dict]:
    selector = f"{INSTANCE_LABEL}={name},app.kubernetes.io/component=tts-server"
    return _get(cluster, "deployments", "-n", namespace, "-l", selector)["items"]


def _jobs(cluster, namespace: str, name: str) -> list[dict]:
    return [j for j in _get(cluster, "jobs", "-n", namespace, "-l", f"{INSTANCE_LABEL}={name}")["items"]
            if not j["metadata"].get("deletionTimestamp")]


def _status(cluster, namespace: str, name: str) -> dict:
    ctd = _get(cluster, "ctd", name, "-n", namespace)
    status = ctd.get("status") or {}
    return status if status.get("observedGeneration") == ctd["metadata"]["generation"] else {}


def _refusals(caplog, own_namespace: str | None = None) -> list[str]:
    """Log records about refused requests, tracebacks of failed handlers included.

    A cluster-wide operator also meets objects left in other tests' namespaces while those
    terminate, and the API server forbids new Events there whatever the RBAC: with
    ``own_namespace`` such records (naming another test namespace, ``t-...``) are not counted."""
    refusal = re.compile(r"\b403\b|[Ff]orbidden|Not enough permissions")
    test_namespace = re.compile(r"\bt-[a-z0-9-]+")
    formatter = logging.Formatter()
    found = []
    for record in caplog.records:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + formatter.formatException(record.exc_info)
        if not refusal.search(text):
            continue
        named = set(test_namespace.findall(text))
        if own_namespace and named and own_namespace not in named:
            continue
        found.append(text)
    return found


@pytest.fixture
def weights(cluster, namespace) -> Iterator[dict[str, str]]:
    """Read-only fp16 weights, a writable output claim and calibration texts, as static hostPath
    PersistentVolumes bound to claims in the namespace (no provisioner here)."""
    suffix = secrets.token_hex(3)
    claims = {"weights": ("ReadOnlyMany", f"rbac-weights-{suffix}"), "awq": ("ReadWriteMany", f"rbac-awq-{suffix}")}
    documents = []
    for claim, (mode, volume) in claims.items():
        documents.append({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume},
                          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": [mode], "storageClassName": "",
                                   "persistentVolumeReclaimPolicy": "Retain",
                                   "claimRef": {"namespace": namespace, "name": claim},
                                   "hostPath": {"path": f"/srv/{volume}", "type": "DirectoryOrCreate"}}})
        documents.append({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                          "metadata": {"name": claim, "namespace": namespace},
                          "spec": {"accessModes": [mode], "storageClassName": "", "volumeName": volume,
                                   "resources": {"requests": {"storage": "1Gi"}}}})
    documents.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "calibration", "namespace": namespace},
                      "data": {"texts.jsonl": '{"text": "hello"}\n'}})
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
    try:
        yield {"weights": "weights", "awq": "awq"}
    finally:
        for _, volume in claims.values():
            cluster.kubectl("delete", "pv", volume, "--wait=false", "--ignore-not-found", check=False)


POOL_LABEL = "chattts.io/rbac-test-pool"
POOL_NODE_MIB = 81920


@pytest.fixture
def private_pool(cluster) -> Iterator[dict[str, str]]:
    """One simulated GPU node only this test's policy selects (kwok keeps it Ready), tainted so
    no other test's pods land there: other policies in a shared cluster cannot overlap it."""
    token = secrets.token_hex(3)
    name = f"rbac-pool-{token}"
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "1",
                 "nvidia.com/gpu.memory": str(POOL_NODE_MIB)}
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {POOL_LABEL: token, "kubernetes.io/hostname": name, "type": "kwok",
                                    "nvidia.com/gpu.memory": str(POOL_NODE_MIB), "nvidia.com/gpu.count": "1"}},
            "spec": {"taints": [{"key": POOL_LABEL, "value": token, "effect": "NoSchedule"}]},
            "status": {"capacity": resources, "allocatable": resources}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(node))
    try:
        cluster.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p",
                        json.dumps({"status": {"capacity": resources, "allocatable": resources}}))
        _wait_for(lambda: any(c["type"] == "Ready" and c["status"] == "True"
                              for c in _get(cluster, "node", name)["status"].get("conditions", [])),
                  f"node {name} Ready under kwok", timeout=60)
        yield {POOL_LABEL: token}
    finally:
        cluster.kubectl("delete", "node", name, "--wait=false", "--ignore-not-found", check=False)


def _ctd(name: str, group_size: int, max_num_seqs: int, labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "replicas": 1,
            "model": {"pvc": {"claimName": "weights"}, "format": "fp16"},
            "engine": {"maxNumSeqs": max_num_seqs, "maxModelLen": 1024},  # fits 16Gi on the graph engine
            "gpu": {"memory": "16Gi", "profile": "hami"},
            # min 2 with 1 replica: the autoscaler's first pass scales up through /scale.
            "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 3},
            "quantization": {"calibration": {"configMap": {"name": "calibration", "key": "texts.jsonl"}},
                             "output": {"claimName": "awq", "subPath": "awq"}, "groupSize": group_size},
        },
    }


def test_operator_reconciles_a_full_lifecycle_under_the_chart_identity(cluster, identity, weights, monkeypatch,
                                                                        caplog):
    """Every code path of the core, the autoscaler and quantization, as the chart's identity."""
    ns, name = identity.namespace, "rbac-tts"
    caplog.set_level(logging.INFO)
    with operator_running_as(identity, monkeypatch):
        # create: Deployment, Service, ConfigMap; the AWQ Job; the autoscaler scales 1 -> 2.
        # With spec.auth and spec.networkPolicy: the NetworkPolicy child is applied; by default the
        # chart grants no Secret reads, so the APIKeys condition says the Secret was not checked.
        locked = _ctd(name, 128, 64)
        locked["spec"].update(auth={"secretName": "rbac-keys"}, networkPolicy={})
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(locked))
        (deployment,) = _wait_for(lambda: _serving_deployments(cluster, ns, name), "the serving Deployment")
        _wait_for(lambda: cluster.kubectl("get", "networkpolicy", name, "-n", ns, check=False).returncode == 0,
                  "the NetworkPolicy")
        _wait_for(lambda: any(c["type"] == "APIKeys" and c["reason"] == "SecretNotChecked"
                              for c in _status(cluster, ns, name).get("conditions") or []),
                  "the APIKeys condition (SecretNotChecked)")
        limits = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpumem"] == "16384" and limits["nvidia.com/gpu"] == "1"
        (first_job,) = _wait_for(lambda: _jobs(cluster, ns, name), "the quantization Job")
        _wait_for(lambda: _get(cluster, "ctd", name, "-n", ns)["spec"]["replicas"] == 2,
                  "the autoscaler to scale to minReplicas", timeout=120)
        _wait_for(lambda: _status(cluster, ns, name).get("readyReplicas") == 2, "2 ready replicas in status")
        _wait_for(lambda: (_status(cluster, ns, name).get("quantization") or {}).get("state") == "Succeeded",
                  "the quantization Job to succeed (kwok completes its pod)")

        # update: a new quantization spec replaces the Job (stale one deleted); the engine change
        # reaches the runtime config; status follows.
        cluster.kubectl("patch", "ctd", name, "-n", ns, "--type=merge", "-p", json.dumps(
            {"spec": {"engine": {"maxNumSeqs": 32}, "quantization": {"groupSize": 64},
                      "networkPolicy": {"enabled": False}}}))
        _wait_for(lambda: cluster.kubectl("get", "networkpolicy", name, "-n", ns, check=False).returncode != 0,
                  "the disabled NetworkPolicy deleted")
        stale = first_job["metadata"]["name"]
        _wait_for(lambda: (names := [j["metadata"]["name"] for j in _jobs(cluster, ns, name)]) and stale not in names,
                  "the stale Job to be replaced by a new one")
        _wait_for(lambda: "max_num_seqs: 32" in json.dumps(_get(cluster, "configmaps", "-n", ns, "-l",
                                                                 f"{INSTANCE_LABEL}={name}")["items"]),
                  "the runtime config to carry the new engine setting")
        _wait_for(lambda: _status(cluster, ns, name).get("readyReplicas") == 2, "status of the new generation")

        # delete: completes (any finalizer of the operator is released); the garbage collector takes the children.
        cluster.kubectl("delete", "ctd", name, "-n", ns, "--wait=true", "--timeout=60s")
        _wait_for(lambda: not _serving_deployments(cluster, ns, name) and not _jobs(cluster, ns, name),
                  "the garbage collector to remove the children")

    refused = _refusals(caplog, identity.namespace)
    assert not refused, "the operator was refused:\n" + "\n".join(refused)


def _apply_all_day_policy(cluster, name: str, pool: dict[str, str]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "tts.chattts.io/v1alpha1", "kind": "GPUSharePolicy", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": pool},
                 "windows": [{"name": "all-day", "start": "00:00", "end": "24:00", "online": 50, "offline": 50}]}}))


def _force_delete_policy(cluster, name: str) -> None:
    """A policy the test could not delete cleanly: its finalizer released, then deleted."""
    if cluster.kubectl("get", "gsp", name, check=False).returncode == 0:
        cluster.kubectl("patch", "gsp", name, "--type=merge", "-p", '{"metadata": {"finalizers": null}}', check=False)
        cluster.kubectl("delete", "gsp", name, "--ignore-not-found", check=False)


def test_share_policy_runs_under_the_chart_identity(cluster, identity, weights, private_pool, monkeypatch, caplog):
    """GPUSharePolicy passes: nodes, members in the namespace, a Job resumed, a replica cap
    written, policy status and Events (kopf posts those of a cluster-scoped object in
    "default"), the finalizer released."""
    ns = identity.namespace
    policy = f"rbac-{secrets.token_hex(3)}"
    label = {"tts.chattts.io/share-policy": policy}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "offline", "labels": label},
           "spec": {"suspend": True, "template": {"spec": {
               "restartPolicy": "Never",
               "tolerations": [{"key": POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
               "containers": [{"name": "work", "image": "chattts-runtime:0.1.0",
                               "resources": {"limits": {"nvidia.com/gpu.memory": "16384"}}}]}}}}
    caplog.set_level(logging.INFO)
    try:
        with operator_running_as(identity, monkeypatch):
            _apply_all_day_policy(cluster, policy, private_pool)
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(job))
            member = _ctd("member", 128, 64, labels=label)
            del member["spec"]["quantization"], member["spec"]["autoscaling"]
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(member))
            _wait_for(lambda: _get(cluster, "job", "offline", "-n", ns)["spec"].get("suspend") is False,
                      "the policy to resume its offline Job")
            _wait_for(lambda: "tts.chattts.io/replica-cap" in (
                _get(cluster, "ctd", "member", "-n", ns)["metadata"].get("annotations") or {}),
                "the policy's replica cap on its online member")
            _wait_for(lambda: (_get(cluster, "gsp", policy).get("status") or {}).get("shares"), "the policy's status")
            _wait_for(lambda: _get(cluster, "events", "-n", "default", "--field-selector",
                                   f"involvedObject.name={policy}")["items"], "an Event about the policy")
            cluster.kubectl("delete", "gsp", policy, "--wait=true", "--timeout=60s")
    finally:
        _force_delete_policy(cluster, policy)
    refused = _refusals(caplog, identity.namespace)
    assert not refused, "the operator was refused:\n" + "\n".join(refused)


def test_dra_profile_runs_under_the_chart_identity(cluster, identity, weights, private_pool, monkeypatch, caplog):
    """The dra profile's calls: the claim template applied, the claims read for status and by
    a share policy pass, the template deleted when the profile is left."""
    ns = identity.namespace
    (node,) = _get(cluster, "nodes", "-l", ",".join(f"{k}={v}" for k, v in private_pool.items()))["items"]
    gpu = draslices.SimulatedGpu(name="gpu-0", uuid=f"GPU-{node['metadata']['name']}", product="NVIDIA TEST",
                                 architecture="Hopper", compute="9.0.0", memory_mib=POOL_NODE_MIB)
    slice_ = draslices.resource_slice(node["metadata"]["name"], [gpu])
    draslices.apply(cluster.api, [draslices.device_class(), slice_])
    policy = f"rbac-{secrets.token_hex(3)}"
    member = _ctd("dra", 128, 64, labels={"tts.chattts.io/share-policy": policy})
    del member["spec"]["quantization"], member["spec"]["autoscaling"]
    member["spec"]["gpu"] = {"memory": "16Gi", "profile": "dra", "nodeSelector": private_pool}
    member["spec"]["tolerations"] = [{"key": POOL_LABEL, "operator": "Exists", "effect": "NoSchedule"}]
    caplog.set_level(logging.INFO)
    try:
        with operator_running_as(identity, monkeypatch):
            _apply_all_day_policy(cluster, policy, private_pool)
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(member))
            _wait_for(lambda: ((_status(cluster, ns, "dra").get("gpu") or {}).get("dra") or {}).get(
                "allocatedMemoryMiB") == 16384, "the claim allocated, in status")
            _wait_for(lambda: ((_get(cluster, "gsp", policy).get("status") or {}).get("used") or {}).get(
                "totalMiB") == 16384, "the policy counting the claim")
            cluster.kubectl("patch", "ctd", "dra", "-n", ns, "--type=merge", "-p",
                            '{"spec": {"gpu": {"profile": "gpu-memory"}}}')
            _wait_for(lambda: not _get(cluster, "resourceclaimtemplates", "-n", ns)["items"],
                      "the claim template deleted once the profile is left")
            cluster.kubectl("delete", "gsp", policy, "--wait=true", "--timeout=60s")
    finally:
        cluster.kubectl("delete", "resourceslice", slice_["metadata"]["name"], "--ignore-not-found", check=False)
        _force_delete_policy(cluster, policy)
    refused = _refusals(caplog, identity.namespace)
    assert not refused, "the operator was refused:\n" + "\n".join(refused)


def test_operator_without_its_bindings_is_refused(cluster, identity, monkeypatch, caplog):
    """Control for the test above: the operator really runs as the ServiceAccount (not as the
    admin of the test cluster), so without the chart's bindings it is refused."""
    selector = f"{INSTANCE_LABEL}={identity.release}"
    cluster.kubectl("delete", "clusterrolebindings", "-l", selector)
    cluster.kubectl("delete", "rolebindings", "-A", "-l", selector)
    caplog.set_level(logging.INFO)
    with operator_running_as(identity, monkeypatch, expect_clean_exit=False):
        _wait_for(lambda: _refusals(caplog), "the operator's first refused request", timeout=60)


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


def test_api_key_secret_check_works_under_its_opt_in_rbac(cluster, namespace, helm, tmp_path, monkeypatch, caplog):
    """rbac.apiKeySecretCheck: true grants get on Secrets and turns the check on: the
    metadata-only get is enough for SecretNotFound, then SecretFound, and list stays refused."""
    caplog.set_level(logging.INFO)
    with _chart_identity(cluster, namespace, helm, tmp_path, [namespace], {"rbac": {"apiKeySecretCheck": True}}) \
            as identity:
        assert identity.env["CHATTTS_OPERATOR_API_KEY_SECRET_CHECK"] == "true"
        assert identity.can_i(cluster, "get", "secrets", "-n", namespace)
        assert not identity.can_i(cluster, "list", "secrets", "-n", namespace)
        assert not identity.can_i(cluster, "get", "secrets", "-n", "kube-system")
        identity.env["CHATTTS_OPERATOR_RESYNC_INTERVAL_SECONDS"] = "2"  # nothing watches Secrets
        with operator_running_as(identity, monkeypatch):
            body = _ctd("rbac-keys", 128, 64)
            del body["spec"]["quantization"], body["spec"]["autoscaling"]
            body["spec"]["auth"] = {"secretName": "rbac-api-keys"}
            cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))

            def api_keys_reason():
                conditions = _status(cluster, namespace, "rbac-keys").get("conditions") or []
                return next((c["reason"] for c in conditions if c["type"] == "APIKeys"), None)

            _wait_for(lambda: api_keys_reason() == "SecretNotFound", "APIKeys SecretNotFound")
            cluster.kubectl("create", "secret", "generic", "rbac-api-keys", "-n", namespace, "--from-literal=k=v")
            _wait_for(lambda: api_keys_reason() == "SecretFound", "APIKeys SecretFound")
            cluster.kubectl("delete", "ctd", "rbac-keys", "-n", namespace, "--wait=true", "--timeout=60s")
    refused = _refusals(caplog, namespace)
    assert not refused, "the operator was refused:\n" + "\n".join(refused)
