"""spec.auth and spec.networkPolicy against the real local control plane: the operator (a
subprocess, as in its container) renders the NetworkPolicy, mounts the Secret read-only,
points the runtime config at it, says when the Secret is missing, and deletes the policy
when it is disabled. The local API server enforces no NetworkPolicy (no network plugin),
so the rendered object is what is asserted; the runtime's 401s are tested in
tests/runtime."""
from __future__ import annotations

import time

import yaml

from chattts_operator.core.labels import FIELD_MANAGER
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment import children as builders
from chattts_operator.deployment.spec import desired_state, parse_spec
from tests.cluster.helpers import apply, get, runtime_configmap, runtime_yaml
from tests.support import ctd, wait_until

KEY = "k-4d1f0c2e9b7a"  # written into the Secret only; must appear nowhere else
PEERS = [{"namespaceSelector": {"matchLabels": {"team": "apps"}}, "podSelector": {"matchLabels": {"app": "web"}}}]


def condition(obj, ctype):
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def exists(kubectl, namespace, kind, name) -> bool:
    return kubectl("get", kind, name, "-n", namespace, check=False).returncode == 0


def test_auth_and_network_policy_are_rendered_and_reported(crds, namespace, operators):
    kubectl = crds.kubectl
    # A short resync: nothing watches Secrets, so a Secret created later is seen by the resync.
    operators(resync_interval_seconds="2", api_key_secret_check="true").start()
    body = ctd("locked", replicas=1, auth={"secretName": "locked-keys", "keys": ["team-a"]},
               networkPolicy={"allowFrom": PEERS})
    apply(kubectl, namespace, body)

    # The Secret does not exist yet: status says so, with the reason.
    obj = wait_until(lambda: (o := get(kubectl, namespace, "ctd", "locked"))
                     and condition(o, "APIKeys").get("reason") == "SecretNotFound" and o, "APIKeys SecretNotFound")
    assert condition(obj, "APIKeys")["status"] == "False"
    degraded = condition(obj, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "SecretNotFound"
    assert f"{namespace}/locked-keys" in degraded["message"]

    # The NetworkPolicy: exactly what the pure builder renders (it depends on no operator
    # setting), server-side applied by the operator's field manager, owned by the object.
    policy = wait_until(lambda: exists(kubectl, namespace, "networkpolicy", "locked")
                        and get(kubectl, namespace, "networkpolicy", "locked", "--show-managed-fields"),
                        "the NetworkPolicy")
    live_body = get(kubectl, namespace, "ctd", "locked")
    wanted = desired_state(live_body, parse_spec(live_body), OperatorSettings(),
                           largest_node_gpu_mib=None).network_policy
    assert policy["spec"] == wanted["spec"]
    port = [{"protocol": "TCP", "port": builders.HTTP_PORT}]
    assert policy["spec"]["ingress"] == [
        {"from": PEERS, "ports": port},
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
         "ports": port},
    ]
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "locked"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == live_body["metadata"]["uid"]
    assert {(m["manager"], m["operation"]) for m in policy["metadata"]["managedFields"]} == {(FIELD_MANAGER, "Apply")}

    # The Secret volume (read-only) and the runtime config that points at it.
    dep = wait_until(lambda: exists(kubectl, namespace, "deploy", "locked") and get(kubectl, namespace, "deploy",
                                                                                    "locked"), "the Deployment")
    pod_spec = dep["spec"]["template"]["spec"]
    volume = next(v for v in pod_spec["volumes"] if v["name"] == "api-keys")
    assert volume["secret"]["secretName"] == "locked-keys"
    assert volume["secret"]["items"] == [{"key": "team-a", "path": "team-a"}]
    mount = next(m for m in pod_spec["containers"][0]["volumeMounts"] if m["name"] == "api-keys")
    assert mount == {"name": "api-keys", "mountPath": builders.API_KEYS_MOUNT_PATH, "readOnly": True}
    assert yaml.safe_load(runtime_yaml(kubectl, namespace, "locked"))["server"]["api_keys_path"] == builders.API_KEYS_MOUNT_PATH

    # The Secret appears: the next resync finds it.
    kubectl("create", "secret", "generic", "locked-keys", "-n", namespace, f"--from-literal=team-a={KEY}")
    obj = wait_until(lambda: (o := get(kubectl, namespace, "ctd", "locked"))
                     and condition(o, "APIKeys").get("status") == "True" and o, "APIKeys SecretFound", timeout=60)
    assert condition(obj, "APIKeys")["reason"] == "SecretFound"
    assert condition(obj, "Degraded")["status"] == "False"
    # The key itself went nowhere: not into the ConfigMap, the Deployment, nor status.
    configmap = runtime_configmap(kubectl, namespace, "locked")["metadata"]["name"]
    for text in (kubectl("get", "configmap", configmap, "-n", namespace, "-o", "yaml").stdout,
                 kubectl("get", "deploy", "locked", "-n", namespace, "-o", "yaml").stdout,
                 kubectl("get", "ctd", "locked", "-n", namespace, "-o", "yaml").stdout):
        assert KEY not in text

    # Disabled: the operator deletes its NetworkPolicy; re-enabled, it comes back; removed: gone again.
    kubectl("patch", "ctd", "locked", "-n", namespace, "--type=merge", "-p", '{"spec":{"networkPolicy":{"enabled":false}}}')
    wait_until(lambda: not exists(kubectl, namespace, "networkpolicy", "locked"), "the NetworkPolicy deleted",
               timeout=30)
    kubectl("patch", "ctd", "locked", "-n", namespace, "--type=merge", "-p", '{"spec":{"networkPolicy":{"enabled":true}}}')
    wait_until(lambda: exists(kubectl, namespace, "networkpolicy", "locked"), "the NetworkPolicy back", timeout=30)
    kubectl("patch", "ctd", "locked", "-n", namespace, "--type=json",
            "-p", '[{"op":"remove","path":"/spec/networkPolicy"}]')
    wait_until(lambda: not exists(kubectl, namespace, "networkpolicy", "locked"), "the NetworkPolicy deleted again",
               timeout=30)

    # Auth removed: the volume and the config's path go, and so does the APIKeys condition.
    kubectl("patch", "ctd", "locked", "-n", namespace, "--type=json", "-p", '[{"op":"remove","path":"/spec/auth"}]')
    wait_until(lambda: yaml.safe_load(runtime_yaml(kubectl, namespace, "locked"))["server"].get("api_keys_path")
               is None, "the config without api_keys_path", timeout=30)
    obj = wait_until(lambda: (o := get(kubectl, namespace, "ctd", "locked"))
                     and not condition(o, "APIKeys") and o, "no APIKeys condition", timeout=30)
    dep = get(kubectl, namespace, "deploy", "locked")
    assert "api-keys" not in {v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]}


def test_a_network_policy_not_ours_is_left_alone(crds, namespace, operators):
    kubectl = crds.kubectl
    operators(resync_interval_seconds="2").start()
    foreign = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "plain"},
               "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    apply(kubectl, namespace, foreign, ctd("plain", replicas=0))
    wait_until(lambda: (get(kubectl, namespace, "ctd", "plain").get("status") or {}).get("observedGeneration"),
               "plain reconciled")
    time.sleep(5)  # a few resyncs (every 2 s): each one looks for a NetworkPolicy to prune
    assert exists(kubectl, namespace, "networkpolicy", "plain")
