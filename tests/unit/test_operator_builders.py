"""Pure builders: spec -> ConfigMap, Deployment, Service, PodDisruptionBudget."""
from __future__ import annotations

import copy

import pytest
import yaml

from chattts_runtime.config import RuntimeConfig

from chattts_operator.deployment import children as builders
from chattts_operator.api import ChatTTSDeploymentSpec
from chattts_operator.deployment.gpu import assign_gpu
from chattts_operator.core.settings import OperatorSettings

SETTINGS = OperatorSettings()
OWNER = builders.Owner(name="tts", namespace="voice", uid="1234")


def spec_of(**overrides) -> ChatTTSDeploymentSpec:
    base = {"model": {"pvc": {"claimName": "weights"}, "format": "awq"}, "gpu": {"memory": "8Gi"}}
    for key, value in overrides.items():
        base[key] = value
    return ChatTTSDeploymentSpec.model_validate(base)


def deployment_of(spec: ChatTTSDeploymentSpec, settings: OperatorSettings = SETTINGS, replicas: int = 1) -> dict:
    cm = builders.build_configmap(OWNER, spec)
    return builders.build_deployment(OWNER, spec, assign_gpu(spec.gpu, settings), settings,
                                     config_hash_value=builders.config_hash(cm["data"]), replicas=replicas)


def pod(dep: dict) -> dict:
    return dep["spec"]["template"]["spec"]


def test_names_labels_and_owner():
    spec = spec_of()
    for obj in (builders.build_configmap(OWNER, spec), deployment_of(spec), builders.build_service(OWNER),
                builders.build_pdb(OWNER)):
        meta = obj["metadata"]
        assert meta["namespace"] == "voice"
        assert meta["labels"] == {
            "app.kubernetes.io/name": "chattts",
            "app.kubernetes.io/instance": "tts",
            "app.kubernetes.io/component": "tts-server",
            "app.kubernetes.io/managed-by": "chattts-operator",
            "app.kubernetes.io/part-of": "chattts",
        }
        assert meta["ownerReferences"] == [{
            "apiVersion": "tts.chattts.io/v1alpha1", "kind": "ChatTTSDeployment", "name": "tts", "uid": "1234",
            "controller": True, "blockOwnerDeletion": True,
        }]
        assert meta["annotations"][builders.INTENT_HASH_ANNOTATION]
    configmap = builders.build_configmap(OWNER, spec)
    assert configmap["metadata"]["name"] == f"tts-runtime-{builders.config_hash(configmap['data'])}"
    assert builders.mounted_configmap(deployment_of(spec)) == configmap["metadata"]["name"]
    assert deployment_of(spec)["metadata"]["name"] == "tts"


def test_builders_are_deterministic():
    spec = spec_of()
    assert deployment_of(spec) == deployment_of(copy.deepcopy(spec))
    assert builders.build_configmap(OWNER, spec) == builders.build_configmap(OWNER, spec)


def test_configmap_is_a_valid_runtime_config():
    spec = spec_of(engine={"kind": "vllm", "maxNumSeqs": 32, "kvCacheDtype": "fp8", "extraArgs": ["--enforce-eager"]},
                   gpu={"memory": "8Gi", "count": 2}, server={"shutdownGraceSeconds": 60})
    text = builders.build_configmap(OWNER, spec)["data"]["runtime.yaml"]
    config = RuntimeConfig.model_validate(yaml.safe_load(text))
    assert config.model.path == "/models/chattts" and config.model.format.value == "awq"
    assert config.engine.max_num_seqs == 32 and config.engine.kv_cache_dtype == "fp8"
    assert config.engine.tensor_parallel_size == 2
    assert config.engine.extra_args == ["--enforce-eager"]
    assert config.server.port == 8000 and config.server.shutdown_grace_seconds == 60
    assert config.device == "cuda"


@pytest.mark.parametrize(("mode", "runtime_value"), [("upstream", True), ("stream", "stream"), ("off", False)])
def test_speech_voice_from_first_piece_reaches_the_runtime_config(mode, runtime_value):
    spec = spec_of(speech={"voiceFromFirstPiece": mode})
    text = builders.build_configmap(OWNER, spec)["data"]["runtime.yaml"]
    assert RuntimeConfig.model_validate(yaml.safe_load(text)).text.voice_from_first_piece == runtime_value


def test_speech_defaults_to_upstreams_output_and_refuses_other_modes():
    assert spec_of().speech.voice_from_first_piece == "upstream"
    assert RuntimeConfig.model_validate(yaml.safe_load(
        builders.build_configmap(OWNER, spec_of())["data"]["runtime.yaml"])).text.voice_from_first_piece is True
    # The default is the runtime's own default, so adding the field rolled no existing pod.
    assert builders.build_configmap(OWNER, spec_of()) == builders.build_configmap(
        OWNER, spec_of(speech={"voiceFromFirstPiece": "upstream"}))
    with pytest.raises(ValueError, match="voiceFromFirstPiece|voice_from_first_piece"):
        spec_of(speech={"voiceFromFirstPiece": "true"})


def test_config_change_rolls_pods_and_nothing_else_does():
    a = deployment_of(spec_of())
    b = deployment_of(spec_of(engine={"maxNumSeqs": 8}))
    key = builders.CONFIG_HASH_ANNOTATION
    assert a["spec"]["template"]["metadata"]["annotations"][key] != b["spec"]["template"]["metadata"]["annotations"][key]
    c = deployment_of(spec_of(), replicas=3)
    assert a["spec"]["template"] == c["spec"]["template"]
    assert a["metadata"]["annotations"] != c["metadata"]["annotations"]  # the intent hash covers replicas


@pytest.mark.parametrize(
    "model, volume, mount_extra",
    [
        ({"pvc": {"claimName": "w"}}, {"persistentVolumeClaim": {"claimName": "w", "readOnly": True}}, {}),
        ({"pvc": {"claimName": "w", "subPath": "chattts/awq"}},
         {"persistentVolumeClaim": {"claimName": "w", "readOnly": True}}, {"subPath": "chattts/awq"}),
        ({"hostPath": {"path": "/data/chattts"}}, {"hostPath": {"path": "/data/chattts", "type": "Directory"}}, {}),
        ({"image": {"reference": "reg.example/chattts-awq:v1"}},
         {"image": {"reference": "reg.example/chattts-awq:v1", "pullPolicy": "IfNotPresent"}}, {}),
    ],
)
def test_weights_are_read_only_from_every_source(model, volume, mount_extra):
    dep = deployment_of(spec_of(model=model))
    volumes = {v["name"]: v for v in pod(dep)["volumes"]}
    assert volumes["model"] == {"name": "model", **volume}
    mounts = {m["name"]: m for m in pod(dep)["containers"][0]["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models/chattts", "readOnly": True, **mount_extra}
    assert mounts["config"]["readOnly"] is True and mounts["config"]["mountPath"] == "/etc/chattts"
    writable = [m["mountPath"] for m in mounts.values() if not m.get("readOnly")]
    assert writable == ["/tmp"]


def test_restricted_security_context():
    p = pod(deployment_of(spec_of()))
    assert p["securityContext"] == {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                    "seccompProfile": {"type": "RuntimeDefault"}}
    assert p["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert p["automountServiceAccountToken"] is False


def test_probes_ports_and_grace():
    p = pod(deployment_of(spec_of(server={"shutdownGraceSeconds": 120})))
    c = p["containers"][0]
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert p["terminationGracePeriodSeconds"] > 120
    assert c["args"] == ["serve", "--config", "/etc/chattts/runtime.yaml"]


@pytest.mark.parametrize(
    "profile, count, limits",
    [
        ("gpu-memory", 1, {"nvidia.com/gpu.memory": "8192"}),
        ("gpu-memory", 2, {"nvidia.com/gpu.memory": "16384"}),
        ("hami", 2, {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8192"}),
        ("whole-gpu", 4, {"nvidia.com/gpu": "4"}),
        ("mig", 1, {"nvidia.com/mig-1g.10gb": "1"}),
    ],
)
def test_gpu_limits_in_pod(profile, count, limits):
    # Tensor parallel (count > 1) is the vllm engine's.
    engine = {"kind": "vllm"} if count > 1 else {}
    dep = deployment_of(spec_of(gpu={"memory": "8Gi", "count": count, "profile": profile}, engine=engine))
    resources = pod(dep)["containers"][0]["resources"]
    assert resources["limits"] == {"memory": "8Gi", **limits}
    assert resources["requests"] == {"cpu": "2", "memory": "8Gi"}  # extended resources only in limits
    assert pod(dep)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["8191"]
    has_shm = any(v["name"] == "dshm" for v in pod(dep)["volumes"])
    assert has_shm == (count > 1)


def test_scheduling_fields():
    spec = spec_of(gpu={"memory": "8Gi", "product": "NVIDIA-H200"}, priorityClassName="chattts-online",
                   tolerations=[{"key": "dedicated", "operator": "Equal", "value": "tts", "effect": "NoSchedule"}],
                   image="my/runtime:1")
    p = pod(deployment_of(spec))
    assert p["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert p["priorityClassName"] == "chattts-online"
    assert p["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "tts", "effect": "NoSchedule"},
    ]
    assert p["containers"][0]["image"] == "my/runtime:1"
    assert pod(deployment_of(spec_of()))["containers"][0]["image"] == SETTINGS.runtime_image


def test_rolling_update_never_reduces_capacity():
    dep = deployment_of(spec_of(), replicas=3)
    assert dep["spec"]["replicas"] == 3
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert dep["spec"]["selector"]["matchLabels"] == builders.selector_labels("tts")


def test_service_and_pdb():
    svc = builders.build_service(OWNER)
    assert svc["spec"]["selector"] == builders.selector_labels("tts")
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("http", 8000, "http"), ("metrics", 9090, "http")]
    pdb = builders.build_pdb(OWNER)
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == builders.selector_labels("tts")


def test_intent_hash_ignores_itself():
    dep = deployment_of(spec_of())
    again = builders.with_intent_hash(copy.deepcopy(dep))
    assert again == dep
