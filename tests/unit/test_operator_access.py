"""spec.auth and spec.networkPolicy (pure): the Secret volume, the runtime config, the
NetworkPolicy child, the APIKeys condition, and the CRD schema that carries them."""
from __future__ import annotations

import json

import pytest
import yaml

from chattts_runtime.config import RuntimeConfig

from chattts_operator.api.access import AuthSpec, NetworkPolicySpec, PeerSpec
from chattts_operator.crdgen import build_crd
from chattts_operator.api import CHATTTS_DEPLOYMENT
from chattts_operator.deployment import children as builders
from chattts_operator.deployment.status import SECRET_FOUND, SECRET_MISSING, SECRET_UNCHECKED, Observed, compute_status
from tests.unit.test_operator_reconcile import T0, desired_of, live_deployment, obj

AUTH = {"secretName": "voice-keys", "keys": ["team-a", "team-b"]}


def runtime_yaml(desired) -> str:
    return desired.configmap["data"][builders.CONFIG_KEY]


def container(desired) -> dict:
    return desired.deployment["spec"]["template"]["spec"]["containers"][0]


def volumes(desired) -> dict:
    return {v["name"]: v for v in desired.deployment["spec"]["template"]["spec"]["volumes"]}


# --- auth -----------------------------------------------------------------------------------


def test_auth_mounts_the_secret_read_only_and_points_the_runtime_at_it():
    desired = desired_of(obj({"auth": AUTH}))
    volume = volumes(desired)["api-keys"]
    assert volume == {"name": "api-keys", "secret": {
        "secretName": "voice-keys", "defaultMode": 0o444,
        "items": [{"key": "team-a", "path": "team-a"}, {"key": "team-b", "path": "team-b"}]}}
    mounts = {m["name"]: m for m in container(desired)["volumeMounts"]}
    assert mounts["api-keys"] == {"name": "api-keys", "mountPath": builders.API_KEYS_MOUNT_PATH, "readOnly": True}
    config = RuntimeConfig.model_validate(yaml.safe_load(runtime_yaml(desired)))
    assert config.server.api_keys_path == builders.API_KEYS_MOUNT_PATH
    # Not inside the read-only ConfigMap volume, where no mount point can be made.
    assert not builders.API_KEYS_MOUNT_PATH.startswith(builders.CONFIG_DIR + "/")


def test_auth_without_keys_mounts_every_entry():
    desired = desired_of(obj({"auth": {"secretName": "voice-keys"}}))
    assert "items" not in volumes(desired)["api-keys"]["secret"]


def test_no_auth_no_volume_and_an_open_api():
    desired = desired_of(obj())
    assert "api-keys" not in volumes(desired)
    assert RuntimeConfig.model_validate(yaml.safe_load(runtime_yaml(desired))).server.api_keys_path is None


def test_auth_never_puts_a_key_or_the_secret_into_config_env_or_status():
    desired = desired_of(obj({"auth": AUTH}))
    status = compute_status(desired, Observed(live_deployment(desired), deployment_applied=True,
                                              api_keys_secret=SECRET_FOUND), None, T0)
    c = container(desired)
    assert "env" not in c and "envFrom" not in c
    # The only things the operator knows are names; no data of the Secret exists here at all.
    assert "team-a" not in runtime_yaml(desired) and "voice-keys" not in runtime_yaml(desired)
    assert "team-a" not in json.dumps(status)


def test_changing_auth_rolls_the_pods():
    plain = desired_of(obj())
    keyed = desired_of(obj({"auth": AUTH}))
    assert plain.config_hash != keyed.config_hash


@pytest.mark.parametrize("found, status, reason, degraded", [
    (SECRET_FOUND, "True", "SecretFound", "False"),
    (SECRET_MISSING, "False", "SecretNotFound", "True"),
    (SECRET_UNCHECKED, "Unknown", "SecretNotChecked", "False"),
])
def test_api_keys_condition(found, status, reason, degraded):
    desired = desired_of(obj({"auth": AUTH}))
    out = compute_status(desired, Observed(live_deployment(desired), deployment_applied=True,
                                           api_keys_secret=found), None, T0)
    by_type = {c["type"]: c for c in out["conditions"]}
    assert by_type["APIKeys"]["status"] == status and by_type["APIKeys"]["reason"] == reason
    assert "ns/voice-keys" in by_type["APIKeys"]["message"]
    assert by_type["Degraded"]["status"] == degraded
    if found == SECRET_MISSING:
        assert by_type["Degraded"]["reason"] == "SecretNotFound"
        assert "ContainerCreating" in by_type["Degraded"]["message"]
        assert out["phase"] == "Degraded"


def test_no_api_keys_condition_without_auth():
    desired = desired_of(obj())
    out = compute_status(desired, Observed(live_deployment(desired), deployment_applied=True), None, T0)
    assert "APIKeys" not in {c["type"] for c in out["conditions"]}


# --- networkPolicy ------------------------------------------------------------------------------


def test_no_network_policy_unless_asked():
    assert desired_of(obj()).network_policy is None
    assert desired_of(obj({"networkPolicy": {"enabled": False}})).network_policy is None
    assert "NetworkPolicy" not in {c["kind"] for c in desired_of(obj()).children()}


def test_default_network_policy_this_namespace_and_monitoring():
    desired = desired_of(obj({"networkPolicy": {}}))
    policy = desired.network_policy
    assert policy["apiVersion"] == "networking.k8s.io/v1" and policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["name"] == "tts" and policy["metadata"]["namespace"] == "ns"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert policy["spec"]["podSelector"] == desired.deployment["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    port = [{"protocol": "TCP", "port": builders.HTTP_PORT}]
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": port},
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
         "ports": port},
    ]
    assert desired.children()[-1] is policy


def test_network_policy_peers_as_written():
    peers = [
        {"namespaceSelector": {"matchLabels": {"team": "apps"}}, "podSelector": {"matchLabels": {"app": "web"}}},
        {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["api"]}]}},
    ]
    scrapers = [{"namespaceSelector": {"matchExpressions": [{"key": "prometheus", "operator": "Exists"}]}}]
    policy = desired_of(obj({"networkPolicy": {"allowFrom": peers, "metricsFrom": scrapers}})).network_policy
    assert policy["spec"]["ingress"][0]["from"] == peers
    assert policy["spec"]["ingress"][1]["from"] == scrapers


def test_empty_metrics_from_drops_the_scrape_rule():
    policy = desired_of(obj({"networkPolicy": {"metricsFrom": []}})).network_policy
    assert len(policy["spec"]["ingress"]) == 1


def test_blocked_spec_still_applies_the_network_policy():
    desired = desired_of(obj({"networkPolicy": {}}, gpu={"memory": "8Gi", "profile": "mig"}), largest=1024)
    assert not desired.rollout_allowed
    assert [c["kind"] for c in desired.children()] == ["Service", "PodDisruptionBudget", "NetworkPolicy"]


@pytest.mark.parametrize("model, data", [
    (AuthSpec, {"secretName": "k", "keys": [".hidden"]}),
    (AuthSpec, {"secretName": "k", "keys": []}),
    (AuthSpec, {"secretName": "k", "keys": ["a", "a"]}),
    (PeerSpec, {}),
    (PeerSpec, {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}),
    (NetworkPolicySpec, {"allowFrom": [{"podSelector": {"matchLabels": {"a": "b"}}, "ipBlock": {}}]}),
])
def test_models_refuse(model, data):
    with pytest.raises(ValueError):
        model.model_validate(data)


def test_crd_schema_carries_the_rules():
    schema = build_crd(CHATTTS_DEPLOYMENT)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    auth = spec["auth"]
    assert auth["required"] == ["secretName"]
    assert auth["properties"]["keys"]["x-kubernetes-list-type"] == "set"
    assert auth["properties"]["keys"]["items"]["pattern"].startswith("^[-_a-zA-Z0-9]")
    assert auth["properties"]["secretName"]["description"]
    peer = spec["networkPolicy"]["properties"]["allowFrom"]["items"]
    assert "has(self.namespaceSelector) || has(self.podSelector)" in json.dumps(peer["x-kubernetes-validations"])
    assert spec["networkPolicy"]["properties"]["metricsFrom"]["default"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
