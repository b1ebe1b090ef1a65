"""`helm lint` and `helm template`: what the chart renders for a range of values, and the
values it refuses. No cluster needed (test_chart_cluster.py sends the output to a real API server)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from chattts_operator.core.settings import ENV_PREFIX, OperatorSettings
from conftest import CHART, REPO, Helm, by_kind, one

pytestmark = pytest.mark.helm

EVERYTHING_ON = {
    "watchNamespaces": ["tts-b", "tts-a"],
    "gpu": {"sharingProfile": "mig", "migProfiles": ["1g.18gb", "2g.35gb", "3g.71gb"]},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "podMonitor": {"enabled": True},
    "dashboard": {"enabled": True, "namespace": "monitoring"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
    "image": {"repository": "registry.example/chattts-operator", "digest": "sha256:" + "a" * 64},
    "operator": {"extraEnv": [{"name": "PYTHONFAULTHANDLER", "value": "1"}]},
}


def operator_container(objects):
    deployment = one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def env_of(container) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize("values", [None, EVERYTHING_ON], ids=["defaults", "everything-on"])
def test_lint_strict(helm: Helm, tmp_path: Path, values):
    args = ["lint", "--strict", str(CHART), "--kube-version", "1.36.0"]
    if values is not None:
        path = tmp_path / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["--values", str(path)]
    result = helm.run(*args)
    assert "0 chart(s) failed" in result.stdout


def test_defaults_render_the_operator_and_nothing_optional(helm: Helm):
    objects = helm.render()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted([
        "CustomResourceDefinition", "CustomResourceDefinition", "ServiceAccount", "Deployment", "Service",
        "ClusterRole", "ClusterRole", "ClusterRoleBinding", "ClusterRoleBinding",
    ])
    # Optional objects whose CRDs (Prometheus Operator) may be absent are not rendered by default.
    assert not by_kind(objects, "ServiceMonitor") and not by_kind(objects, "PodMonitor")
    for obj in objects:
        if obj["kind"] != "CustomResourceDefinition" and obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "chattts-system", obj["metadata"]["name"]


def test_deployment_is_single_recreate_restricted_with_liveness(helm: Helm):
    objects = helm.render()
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = operator_container(objects)
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
    }
    # The only writable path is an emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp": "tmp"}
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in pod["volumes"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    env = env_of(container)
    # The probe hits the port the operator is told to serve kopf's liveness endpoint on.
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert str(ports["health"]) == env["CHATTTS_OPERATOR_HEALTH_PORT"]
    assert str(ports["metrics"]) == env["CHATTTS_OPERATOR_METRICS_PORT"]
    service = one(objects, "Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"


@pytest.mark.parametrize("profile", ["gpu-memory", "hami", "whole-gpu", "mig", "dra"])
def test_env_is_exactly_what_the_operator_settings_accept(helm: Helm, profile):
    """Every CHATTTS_OPERATOR_* variable the chart sets is a setting, and the operator accepts the values."""
    values = {"gpu": {"sharingProfile": profile, "migProfiles": ["1g.18gb", "3g.71gb"]},
              "watchNamespaces": ["b", "a"] if profile == "hami" else []}
    container = operator_container(helm.render(values))
    env = {name: value for name, value in env_of(container).items() if name.startswith(ENV_PREFIX)}
    settings = OperatorSettings.from_env(env)
    assert settings.gpu_profile.value == profile
    assert settings.mig_profiles == ("1g.18gb", "3g.71gb")
    assert settings.watch_namespaces == (("a", "b") if profile == "hami" else ())
    assert settings.runtime_image == "chattts-runtime:0.1.0"  # the chart's appVersion


def test_default_settings_match_the_operators_defaults(helm: Helm):
    """Installing with default values gives the operator's own defaults (one source of truth per knob)."""
    env = {k: v for k, v in env_of(operator_container(helm.render())).items() if k.startswith(ENV_PREFIX)}
    from_chart = OperatorSettings.from_env(env)
    assert from_chart == OperatorSettings()


def test_image_reference_by_digest_and_by_tag(helm: Helm):
    container = operator_container(helm.render(EVERYTHING_ON))
    assert container["image"] == "registry.example/chattts-operator@sha256:" + "a" * 64
    container = operator_container(helm.render({"image": {"tag": "1.2.3"}, "runtime": {"image": {"tag": "9"}}}))
    assert container["image"] == "chattts-operator:1.2.3"
    assert env_of(container)["CHATTTS_OPERATOR_RUNTIME_IMAGE"] == "chattts-runtime:9"


def all_rules(objects):
    for obj in objects:
        if obj["kind"] in ("ClusterRole", "Role"):
            for rule in obj["rules"]:
                yield obj, rule


@pytest.mark.parametrize("values", [None, EVERYTHING_ON], ids=["cluster-wide", "namespaced"])
def test_rbac_has_no_wildcards(helm: Helm, values):
    rules = list(all_rules(helm.render(values)))
    assert rules
    for obj, rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            assert "*" not in rule.get(field, []), f"{obj['kind']} {obj['metadata']['name']}: {rule}"
        assert "nonResourceURLs" not in rule


def test_watch_namespaces_turn_into_roles_in_each_namespace(helm: Helm):
    objects = helm.render(EVERYTHING_ON)
    sa = one(objects, "ServiceAccount")["metadata"]
    # "default" gets only Event creation (kopf posts the Events of cluster-scoped objects there).
    (events_role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["namespace"] == "default"]
    assert events_role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    roles = [r for r in by_kind(objects, "Role") if r["metadata"]["namespace"] != "default"]
    bindings = [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["namespace"] != "default"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["tts-a", "tts-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["tts-a", "tts-b"]
    for binding in bindings:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": roles[0]["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
    # Only cluster-scoped rules stay cluster-wide: no namespaced resource is granted in every namespace.
    (cluster_role,) = by_kind(objects, "ClusterRole")
    namespaced_resources = {res for role in roles for rule in role["rules"] for res in rule["resources"]}
    cluster_resources = {res for rule in cluster_role["rules"] for res in rule["resources"]}
    assert not (namespaced_resources & cluster_resources)
    args = operator_container(objects)["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=tts-a", "--namespace=tts-b"]
    assert "--all-namespaces" not in args


def test_cluster_wide_grants_namespaced_rules_through_a_cluster_role(helm: Helm):
    objects = helm.render()
    assert not by_kind(objects, "Role") and not by_kind(objects, "RoleBinding")
    assert len(by_kind(objects, "ClusterRoleBinding")) == 2
    assert "--all-namespaces" in operator_container(objects)["args"]


def _verbs(objects, group: str, resource: str) -> list[list[str]]:
    return [sorted(rule["verbs"]) for _obj, rule in all_rules(objects)
            if group in rule["apiGroups"] and resource in rule["resources"]]


@pytest.mark.parametrize("values", [None, {"watchNamespaces": ["tts-a"]}], ids=["cluster-wide", "namespaced"])
def test_network_policies_and_secrets_get_exactly_the_verbs_they_need(helm: Helm, values):
    objects = helm.render(values)
    # spec.networkPolicy: applied (get, create, patch), read from a watch-fed cache (list, watch)
    # and deleted when the section goes.
    assert _verbs(objects, "networking.k8s.io", "networkpolicies") == [
        ["create", "delete", "get", "list", "patch", "watch"]]
    # Secrets: nothing unless asked; then get alone (no list/watch), for spec.auth's existence check.
    assert _verbs(objects, "", "secrets") == []
    checked = helm.render({**(values or {}), "rbac": {"apiKeySecretCheck": True}})
    assert _verbs(checked, "", "secrets") == [["get"]]
    # The dra profile: its claim template child (read, applied, listed and deleted when stale);
    # the claims Kubernetes makes from it are only listed, never written.
    assert _verbs(objects, "resource.k8s.io", "resourceclaimtemplates") == [["create", "delete", "get", "list", "patch"]]
    assert _verbs(objects, "resource.k8s.io", "resourceclaims") == [["list"]]
    assert _verbs(objects, "resource.k8s.io", "resourceslices") == []


def test_crds_are_the_generated_ones_kept_on_uninstall(helm: Helm):
    rendered = {c["metadata"]["name"]: c for c in by_kind(helm.render(), "CustomResourceDefinition")}
    generated = {}
    for path in sorted((REPO / "deploy" / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        generated[crd["metadata"]["name"]] = crd
    assert rendered.keys() == generated.keys()
    for name, crd in rendered.items():
        assert crd["spec"] == generated[name]["spec"], f"{name}: rendered spec differs from deploy/crds"
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        for key, value in (generated[name]["metadata"].get("labels") or {}).items():
            assert crd["metadata"]["labels"][key] == value

    not_kept = by_kind(helm.render({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert not_kept and all("annotations" not in c["metadata"] for c in not_kept)
    assert not by_kind(helm.render({"crds": {"install": False}}), "CustomResourceDefinition")


def test_monitors_and_dashboard_render_when_asked(helm: Helm):
    objects = helm.render(EVERYTHING_ON)
    service_monitor = one(objects, "ServiceMonitor")
    assert service_monitor["metadata"]["labels"]["release"] == "prom"
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= one(objects, "Service")["metadata"]["labels"].items()
    pod_monitor = one(objects, "PodMonitor")
    assert pod_monitor["spec"]["namespaceSelector"] == {"matchNames": ["tts-a", "tts-b"]}
    assert pod_monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "tts-server"
    dashboard = one(objects, "ConfigMap")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    parsed = json.loads(dashboard["data"]["chattts.json"])
    assert parsed["panels"]


def test_service_monitor_needs_the_metrics_service(helm: Helm):
    result = helm.template({"serviceMonitor": {"enabled": True}, "metrics": {"service": {"enabled": False}}},
                           check=False)
    assert result.returncode != 0
    assert "serviceMonitor.enabled needs metrics.service.enabled" in result.stderr


@pytest.mark.parametrize(("values", "complaint"), [
    ({"watchNamespaces": "tts"}, "watchNamespaces"),
    ({"watchNamespaces": ["Not_A_Namespace"]}, "watchNamespaces"),
    ({"gpu": {"sharingProfile": "half-a-gpu"}}, "sharingProfile"),
    ({"gpu": {"migProfiles": ["18gb"]}}, "migProfiles"),
    ({"image": {"tag": 1.2}}, "tag"),
    ({"image": {"digest": "latest"}}, "digest"),
    ({"metrics": {"port": "9090"}}, "port"),
    ({"metrics": {"port": 70000}}, "port"),
    ({"crds": {"install": "yes"}}, "install"),
    ({"serviceMonitor": {"enabled": True, "interval": "30 seconds"}}, "interval"),
    ({"tolerations": {"key": "x"}}, "tolerations"),
    ({"tolerations": [{"key": "x", "operator": "Maybe"}]}, "operator"),
    ({"nodeSelector": {"disk": 1}}, "disk"),
    ({"resources": "small"}, "resources"),
    ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets"),
    ({"replicaCount": 2}, "replicaCount"),  # one replica by design: not a knob
    ({"imgae": {"tag": "1"}}, "imgae"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else v)
def test_schema_rejects_wrong_values(helm: Helm, values, complaint):
    result = helm.template(values, check=False)
    assert result.returncode != 0, f"accepted {values}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert complaint in result.stderr


def test_service_account_can_be_brought_by_the_user(helm: Helm):
    objects = helm.render({"serviceAccount": {"create": False, "name": "platform-sa"}})
    assert not by_kind(objects, "ServiceAccount")
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-sa"
    assert all(s["name"] == "platform-sa" for b in by_kind(objects, "ClusterRoleBinding") for s in b["subjects"])
    result = helm.template({"serviceAccount": {"create": False}}, check=False)
    assert result.returncode != 0 and "serviceAccount.name is required" in result.stderr


@pytest.mark.parametrize("values", [None, EVERYTHING_ON, {"operator": {"logLevel": "debug"}}],
                         ids=["cluster-wide", "namespaced", "debug"])
def test_args_are_what_the_operator_cli_accepts(helm: Helm, values):
    from chattts_operator.cli import build_parser

    container = operator_container(helm.render(values))
    args = build_parser().parse_args(container["args"])
    assert args.command == "run"
    assert args.liveness == f"http://0.0.0.0:{env_of(container)['CHATTTS_OPERATOR_HEALTH_PORT']}/healthz"
    if values is EVERYTHING_ON:
        assert args.namespace == ["tts-a", "tts-b"] and not args.all_namespaces
    else:
        assert args.all_namespaces and not args.namespace
    assert args.debug == (values is not None and values.get("operator", {}).get("logLevel") == "debug")
