"""The bad-input corpus: invalid ChatTTSDeployments, each with the words the user must see.

Used twice: here against the pydantic models (the operator refuses them too), and in
tests/cluster/test_operator_crd.py against the real API server, which must reject each one
at apply time with a message containing ``api_message``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import pytest

from chattts_operator.deployment.spec import InvalidSpec, parse_spec


def valid_object(name: str = "tts") -> dict[str, Any]:
    return {
        "apiVersion": "tts.chattts.io/v1alpha1",
        "kind": "ChatTTSDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"pvc": {"claimName": "chattts-weights"}, "format": "awq"},
            "gpu": {"memory": "8Gi"},
        },
    }


@dataclass(frozen=True)
class BadCase:
    id: str
    mutate: Callable[[dict[str, Any]], None]
    api_message: str  # a substring of the API server's rejection


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        node = obj
        keys = path.split(".")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return mutate


def _del(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        node = obj
        keys = path.split(".")
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
    return mutate


CORPUS = [
    BadCase("negative-replicas", _set("spec.replicas", -1), "should be greater than or equal to 0"),
    BadCase("utilization-zero", _set("spec.engine.gpuMemoryUtilization", 0), "should be greater than 0"),
    BadCase("utilization-above-one", _set("spec.engine.gpuMemoryUtilization", 1.5), "should be less than or equal to 1"),
    BadCase("unknown-weight-format", _set("spec.model.format", "int4"), 'Unsupported value: "int4"'),
    BadCase("zero-gpu-memory", _set("spec.gpu.memory", "0"), "gpu.memory must be greater than zero"),
    BadCase("negative-gpu-memory", _set("spec.gpu.memory", "-8Gi"), "gpu.memory must be greater than zero"),
    BadCase("malformed-gpu-memory", _set("spec.gpu.memory", "8 GB"), "gpu.memory must be a quantity"),
    BadCase("two-weight-sources", _set("spec.model.hostPath", {"path": "/models"}), "exactly one weight source"),
    BadCase("no-weight-source", _del("spec.model.pvc"), "exactly one weight source"),
    BadCase(
        "extra-args-override-managed-flag",
        _set("spec.engine.extraArgs", ["--enforce-eager", "--max-num-seqs=8"]),
        "may not set --max-num-seqs=8",
    ),
    BadCase("extra-args-not-a-flag", _set("spec.engine.extraArgs", ["rm -rf /"]), "spec.engine.extraArgs[0]"),
    BadCase("name-too-long", _set("metadata.name", "a" * 46), "at most 45 characters"),
    BadCase("name-not-dns-1035", _set("metadata.name", "tts.v2"), "must be a DNS-1035 label"),
    BadCase("gpu-count-zero", _set("spec.gpu.count", 0), "should be greater than or equal to 1"),
    BadCase("gpu-count-too-many", _set("spec.gpu.count", 16), "should be less than or equal to 8"),
    BadCase(
        "batched-tokens-below-max-seqs",
        _set("spec.engine.maxNumBatchedTokens", 8),
        "engine.maxNumBatchedTokens must be at least engine.maxNumSeqs",
    ),
    BadCase("unknown-kv-cache-dtype", _set("spec.engine.kvCacheDtype", "int4"), 'Unsupported value: "int4"'),
    BadCase("fp8-kv-cache-on-the-default-graph-engine", _set("spec.engine.kvCacheDtype", "fp8"),
            "engine.kvCacheDtype fp8 is not honoured by the graph engine"),
    BadCase("fp8-kv-cache-on-the-reference-engine",
            _set("spec.engine", {"kind": "reference", "kvCacheDtype": "fp8_e4m3"}),
            "engine.kvCacheDtype fp8_e4m3 is not honoured by the reference engine"),
    BadCase("unknown-gpu-profile", _set("spec.gpu.profile", "vgpu"), 'Unsupported value: "vgpu"'),
    BadCase("max-model-len-too-small", _set("spec.engine.maxModelLen", 8), "should be greater than or equal to 16"),
    BadCase("relative-host-path", lambda o: (_del("spec.model.pvc")(o), _set("spec.model.hostPath", {"path": "models"})(o)),
            "spec.model.hostPath.path"),
    BadCase("sub-path-escapes-volume", _set("spec.model.pvc.subPath", "a/../../etc"), "subPath may not contain '..'"),
    BadCase("missing-gpu", _del("spec.gpu"), "spec.gpu: Required value"),
    BadCase("unknown-field", _set("spec.engine.maxBatch", 4), 'unknown field "spec.engine.maxBatch"'),
    BadCase(
        "autoscaling-min-above-max",
        _set("spec.autoscaling", {"enabled": True, "minReplicas": 5, "maxReplicas": 2}),
        "minReplicas must not exceed",
    ),
    BadCase("auth-without-secret", _set("spec.auth", {}), "spec.auth.secretName: Required value"),
    BadCase("auth-secret-name-invalid", _set("spec.auth", {"secretName": "API_Keys"}), "spec.auth.secretName"),
    BadCase("auth-key-hidden-by-dot", _set("spec.auth", {"secretName": "keys", "keys": ["..data"]}),
            "spec.auth.keys[0]"),
    BadCase("auth-key-repeated", _set("spec.auth", {"secretName": "keys", "keys": ["a", "a"]}), "Duplicate value"),
    BadCase("network-policy-empty-peer", _set("spec.networkPolicy", {"allowFrom": [{}]}),
            "needs namespaceSelector, podSelector or both"),
    BadCase("network-policy-in-without-values",
            _set("spec.networkPolicy", {"metricsFrom": [{"podSelector": {"matchExpressions": [
                {"key": "app", "operator": "In"}]}}]}),
            "operator In or NotIn needs values"),
    # Late validations made early: these were refused only after apply (or by the runtime at start-up).
    BadCase("deadline-wait-zero", _set("spec.autoscaling", {"targetSchedulerDeadlineWait": "0ms"}),
            "targetSchedulerDeadlineWait must be at least 0.1ms"),
    BadCase("window-below-a-second", _set("spec.autoscaling", {"window": "500ms"}), "window must be at least 1s"),
    BadCase("scrape-timeout-zero", _set("spec.autoscaling", {"metrics": {"pods": {"timeout": "0s"}}}),
            "timeout must be at least 1ms"),
    BadCase("tuning-quiet-period-short",
            _set("spec.autoscaling", {"batchTokenTuning": {"quietPeriod": "10ms"}}), "quietPeriod must be at least 1s"),
    BadCase("toleration-exists-with-value",
            _set("spec.tolerations", [{"key": "gpu", "operator": "Exists", "value": "a100"}]),
            "a toleration with operator Exists must not set value"),
    BadCase("toleration-no-key-equal", _set("spec.tolerations", [{"value": "a100", "effect": "NoSchedule"}]),
            "a toleration without key must use operator Exists"),
    BadCase("toleration-seconds-without-noexecute",
            _set("spec.tolerations", [{"key": "gpu", "operator": "Exists", "tolerationSeconds": 30}]),
            "tolerationSeconds needs effect NoExecute"),
    BadCase("speculative-config", _set("spec.engine.speculativeConfig", {"method": "ngram", "num_speculative_tokens": 4}),
            "engine.speculativeConfig is not supported"),
    # Refused at apply now (issue 32): each was accepted by the API server and refused only later.
    BadCase("network-policy-label-value-invalid",
            _set("spec.networkPolicy", {"allowFrom": [{"podSelector": {"matchLabels": {"app": "web/v2"}}}]}),
            "spec.networkPolicy.allowFrom[0].podSelector.matchLabels.app"),
    BadCase("network-policy-label-key-invalid",
            _set("spec.networkPolicy", {"allowFrom": [{"podSelector": {"matchLabels": {"-app": "web"}}}]}),
            "matchLabels: a label key must be"),
    BadCase("network-policy-expression-key-invalid",
            _set("spec.networkPolicy", {"allowFrom": [{"namespaceSelector": {"matchExpressions": [
                {"key": "team name", "operator": "Exists"}]}}]}), "a label key must be"),
    BadCase("network-policy-expression-value-too-long",
            _set("spec.networkPolicy", {"allowFrom": [{"namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "In", "values": ["a" * 64]}]}}]}),
            "spec.networkPolicy.allowFrom[0].namespaceSelector.matchExpressions[0].values[0]"),
    BadCase("forecast-period-below-a-minute", _set("spec.autoscaling", {"forecast": {"period": "30s"}}),
            "period must be at least 1m"),
    BadCase("forecast-lead-beyond-period", _set("spec.autoscaling", {"forecast": {"lead": "2h", "period": "1h"}}),
            "forecast.lead must not exceed forecast.period"),
    BadCase("batch-token-tuning-on-graph",
            _set("spec.autoscaling", {"batchTokenTuning": {"enabled": True, "cap": 16384}}),
            "autoscaling.batchTokenTuning needs engine.kind vllm"),
    BadCase("prometheus-url-without-host",
            _set("spec.autoscaling", {"metrics": {"type": "prometheus", "prometheus": {"url": "http://:9090"}}}),
            "metrics.prometheus.url must be an http(s) URL with a host"),
    BadCase("gpu-memory-below-anything-runnable", _set("spec.gpu.memory", "64Mi"), "gpu.memory must be at least 1Gi"),
    BadCase("served-name-with-path", _set("spec.model.servedName", "org/chattts"), "spec.model.servedName"),
    BadCase("tensor-parallel-on-graph", _set("spec.gpu.count", 2), "gpu.count above 1 (tensor parallel) needs"),
    BadCase("network-policy-unknown-operator",
            _set("spec.networkPolicy", {"allowFrom": [{"namespaceSelector": {"matchExpressions": [
                {"key": "team", "operator": "Equals", "values": ["a"]}]}}]}),
            'Unsupported value: "Equals"'),
]


def bad_object(case: BadCase, name: str = "tts") -> dict[str, Any]:
    obj = copy.deepcopy(valid_object(name))
    case.mutate(obj)
    return obj


def test_corpus_is_big_enough_and_ids_unique():
    assert len(CORPUS) >= 15
    assert len({c.id for c in CORPUS}) == len(CORPUS)


def test_valid_object_parses():
    spec = parse_spec(valid_object())
    assert spec.gpu.memory_mib == 8192


@pytest.mark.parametrize("case", CORPUS, ids=[c.id for c in CORPUS])
def test_models_refuse_every_bad_input(case: BadCase):
    with pytest.raises(InvalidSpec):
        parse_spec(bad_object(case))
