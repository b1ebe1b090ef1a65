"""The content-addressed runtime ConfigMap: its name, its hash, and which old ones may go."""
from __future__ import annotations

import yaml
from chattts_runtime.config import RuntimeConfig

from chattts_operator.api.chattts import ChatTTSDeploymentSpec, EngineSpec
from chattts_operator.core.settings import OperatorSettings
from chattts_operator.deployment import children as builders
from chattts_operator.deployment.gpu import assign_gpu
from chattts_operator.deployment.spec import stale_runtime_configmaps

OWNER = builders.Owner(name="tts", namespace="voice", uid="1234")
SETTINGS = OperatorSettings()


def spec_of(**engine) -> ChatTTSDeploymentSpec:
    return ChatTTSDeploymentSpec.model_validate({"model": {"pvc": {"claimName": "weights"}, "format": "awq"},
                                                 "gpu": {"memory": "8Gi"}, "engine": engine})


def deployment_of(spec: ChatTTSDeploymentSpec) -> dict:
    data = builders.build_configmap(OWNER, spec)["data"]
    return builders.build_deployment(OWNER, spec, assign_gpu(spec.gpu, SETTINGS), SETTINGS,
                                     config_hash_value=builders.config_hash(data), replicas=1)


def test_the_name_follows_the_content_and_the_pod_template_names_it():
    a, b = builders.build_configmap(OWNER, spec_of()), builders.build_configmap(OWNER, spec_of(maxNumSeqs=8))
    assert a["metadata"]["name"] != b["metadata"]["name"]
    assert a["metadata"]["name"] == builders.build_configmap(OWNER, spec_of())["metadata"]["name"]
    assert a["immutable"] is True  # a name's data never changes
    for configmap, spec in ((a, spec_of()), (b, spec_of(maxNumSeqs=8))):
        deployment = deployment_of(spec)
        assert builders.mounted_configmap(deployment) == configmap["metadata"]["name"]
        digest = builders.config_hash(configmap["data"])
        assert configmap["metadata"]["name"].endswith(f"-runtime-{digest}")
        assert deployment["spec"]["template"]["metadata"]["annotations"][builders.CONFIG_HASH_ANNOTATION] == digest


def test_the_hash_is_of_the_data_alone():
    data = {"runtime.yaml": "engine: {}\n"}
    assert builders.config_hash(data) == builders.config_hash(dict(data))
    assert builders.config_hash(data) != builders.config_hash({"runtime.yaml": "engine: {max_num_seqs: 1}\n"})
    assert len(builders.config_hash(data)) == builders.CONFIG_HASH_LENGTH


def test_runtime_configmap_names_of_an_owner():
    digest = "0123456789abcdef"
    assert builders.is_runtime_configmap_name("tts", f"tts-runtime-{digest}")
    assert builders.is_runtime_configmap_name("tts", "tts-runtime")  # the layout before content addressing
    assert not builders.is_runtime_configmap_name("tts", f"tts-b-runtime-{digest}")
    assert not builders.is_runtime_configmap_name("tts", "tts-runtime-calibration")
    assert not builders.is_runtime_configmap_name("tts-b", f"tts-runtime-{digest}")


def configmap(name: str, uid: str = OWNER.uid, **meta) -> dict:
    return {"metadata": {"name": name, "ownerReferences": [
        {"kind": "ChatTTSDeployment", "name": OWNER.name, "uid": uid, "controller": True}], **meta}}


def replicaset(name: str, mounts: str, replicas: int = 0, deployment: str = "tts") -> dict:
    return {"metadata": {"name": name, "ownerReferences": [{"kind": "Deployment", "name": deployment, "controller": True}]},
            "spec": {"replicas": replicas, "template": {"spec": {"volumes": [
                {"name": "scratch", "emptyDir": {}}, {"name": "config", "configMap": {"name": mounts}}]}}}}


def test_a_configmap_stays_while_a_revision_of_the_deployment_mounts_it():
    names = [f"tts-runtime-{i:016x}" for i in range(5)]
    configmaps = [configmap(n) for n in names] + [configmap("tts-runtime")]
    replicasets = [
        replicaset("tts-new", names[4], replicas=1),  # serving
        replicaset("tts-old", names[3]),  # scaled down: `kubectl rollout undo` may go back to it
        replicaset("tts-older", "tts-runtime"),  # a revision of the layout before
        replicaset("other", names[0], deployment="tts-b"),  # another Deployment's: does not count
    ]
    stale = stale_runtime_configmaps(OWNER, {names[4]}, configmaps, replicasets)
    # names[1], names[2]: their ReplicaSets were pruned (or never made: a change superseded at once).
    assert stale == [names[0], names[1], names[2]]
    # Wanted now or mounted by the live Deployment (its ReplicaSet not seen yet): kept.
    assert stale_runtime_configmaps(OWNER, {names[1], names[2]}, configmaps, replicasets) == [names[0]]


def test_the_cache_keeps_of_a_replicaset_what_pruning_reads():
    names = [f"tts-runtime-{i:016x}" for i in range(3)]
    configmaps = [configmap(n) for n in names]
    whole = [replicaset("tts-new", names[2], replicas=1), replicaset("tts-old", names[1]),
             replicaset("other", names[0], deployment="tts-b")]
    for rs in whole:  # a real ReplicaSet's template carries the whole pod: containers, probes, env...
        rs["spec"]["template"]["spec"]["containers"] = [{"name": "tts", "image": "x", "env": [{"name": "A"}] * 50}]
    slim = [builders.replicaset_revision({"apiVersion": "apps/v1", "kind": "ReplicaSet", **rs}) for rs in whole]
    assert [builders.mounted_configmap(rs) for rs in slim] == [builders.mounted_configmap(rs) for rs in whole]
    assert stale_runtime_configmaps(OWNER, set(), configmaps, slim) == stale_runtime_configmaps(
        OWNER, set(), configmaps, whole) == [names[0]]
    assert slim[0]["metadata"] == whole[0]["metadata"] and slim[0]["kind"] == "ReplicaSet"
    assert "containers" not in slim[0]["spec"]["template"]["spec"] and "replicas" not in slim[0]["spec"]
    assert builders.replicaset_revision({"metadata": {"name": "bare"}})["spec"]["template"]["spec"]["volumes"] == []


def test_only_this_objects_runtime_configmaps_ever_go():
    others = [
        configmap("tts-runtime-0123456789abcdef", uid="another-uid"),  # a namesake's, recreated
        {"metadata": {"name": "tts-runtime-fedcba9876543210"}},  # nobody's
        configmap("calibration"),  # not a runtime ConfigMap
        configmap("tts-runtime-aaaaaaaaaaaaaaaa", deletionTimestamp="2026-12-01T00:00:00Z"),  # already going
    ]
    assert stale_runtime_configmaps(OWNER, set(), others, []) == []


def test_the_rendered_config_reads_back_as_rendered_whatever_its_strings():
    """The config is emitted with libyaml's emitter when there is one (it folds long escaped
    strings unlike the pure-Python one): what the pods read back is still exactly the config,
    and the name follows the text written."""
    awkward = ["--x=" + "é\"'\\#:{}[]\t" * 12, "--y=" + "a b " * 40, "--z=\u2028中🙂"]
    spec = spec_of(extraArgs=awkward)
    rendered = builders.build_configmap(OWNER, spec)
    text = rendered["data"][builders.CONFIG_KEY]
    assert RuntimeConfig.model_validate(yaml.safe_load(text)) == builders.runtime_config(spec)
    assert rendered["metadata"]["name"].endswith(builders.config_hash({builders.CONFIG_KEY: text}))


def test_every_engine_field_of_the_crd_reaches_the_runtime_config():
    """No silent ignores: each field of spec.engine, set away from its default, shows up in the
    runtime config the pods read (engine.kind as engine_kind, the rest by name)."""
    changed = {"kind": "vllm", "max_num_batched_tokens": 4096, "max_num_seqs": 7, "gpu_memory_utilization": 0.5,
               "max_model_len": 512, "kv_cache_dtype": "fp8", "enable_prefix_caching": True, "rope_theta": 5e5,
               "disable_log_stats": True, "dtype": "bfloat16", "enforce_eager": True, "extra_args": ["--seed=1"]}
    # speculative_config is refused at apply (kept only so stored objects read): nothing to carry.
    assert set(changed) | {"speculative_config"} == set(EngineSpec.model_fields), "a new engine field needs a case here"
    spec = ChatTTSDeploymentSpec.model_validate({"model": {"hostPath": {"path": "/m"}}, "gpu": {"memory": "8Gi"},
                                                 "engine": {EngineSpec.model_fields[k].alias: v
                                                            for k, v in changed.items()}})
    config = builders.runtime_config(spec)
    assert config.engine_kind.value == "vllm"
    for name, value in changed.items():
        if name != "kind":
            assert getattr(config.engine, name) == value, name
