"""Every CEL rule of both CRDs with a value it accepts and one it refuses, for the drift tests:
tests/unit/test_cel_drift.py (the table covers every rule the generated CRDs carry; the models
agree with each case) and tests/cluster/test_cel_drift_api_server.py (the real API server agrees too).

A case is a patch onto a valid object: ``good`` must be accepted and ``bad`` refused, each by
the API server and by the operator's models; ``path`` and ``message`` name the rule (the schema
node carrying it, and a piece of its message); ``expect`` is what the API server must say, when
its message is computed (messageExpression) rather than the rule's own.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

CTD = "ChatTTSDeployment"
GSP = "GPUSharePolicy"


@dataclass(frozen=True)
class CelCase:
    kind: str
    path: str
    message: str
    good: dict[str, Any]
    bad: dict[str, Any]
    expect: str | None = None
    id: str = field(default="")

    @property
    def api_message(self) -> str:
        return self.expect or self.message


def base_object(kind: str, name: str = "drift") -> dict[str, Any]:
    if kind == CTD:
        return {"apiVersion": "tts.chattts.io/v1alpha1", "kind": CTD, "metadata": {"name": name},
                "spec": {"model": {"pvc": {"claimName": "chattts-weights"}, "format": "awq"},
                         "gpu": {"memory": "8Gi"}}}
    return {"apiVersion": "tts.chattts.io/v1alpha1", "kind": GSP, "metadata": {"name": name},
            "spec": {"nodeSelector": {}}}


def merged(base: Any, patch: Any) -> Any:
    """``patch`` over ``base``: mappings merge, a None value deletes, anything else replaces."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def case_object(case: CelCase, which: str, name: str = "drift") -> dict[str, Any]:
    return merged(base_object(case.kind, name), case.good if which == "good" else case.bad)


def _spec(**spec: Any) -> dict[str, Any]:
    return {"spec": spec}


def _auto(**auto: Any) -> dict[str, Any]:
    return _spec(autoscaling=auto)


def _selector_cases() -> list[CelCase]:
    """The label-selector rules sit at every selector: both peer lists of the NetworkPolicy, both
    selectors of a peer."""
    out = []
    for peers in ("allowFrom", "metricsFrom"):
        for selector in ("namespaceSelector", "podSelector"):
            where = f"spec.networkPolicy.{peers}[].{selector}"

            def peer(sel: dict[str, Any], peers: str = peers, selector: str = selector) -> dict[str, Any]:
                return _spec(networkPolicy={peers: [{selector: sel}]})

            out += [
                CelCase(CTD, f"{where}.matchLabels", "matchLabels: a label key must be",
                        peer({"matchLabels": {"example.com/team": "a"}}), peer({"matchLabels": {"team/": "a"}})),
                CelCase(CTD, f"{where}.matchExpressions[]", "operator In or NotIn needs values",
                        peer({"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}),
                        peer({"matchExpressions": [{"key": "team", "operator": "In"}]})),
                CelCase(CTD, f"{where}.matchExpressions[]", "operator Exists or DoesNotExist takes no values",
                        peer({"matchExpressions": [{"key": "team", "operator": "Exists"}]}),
                        peer({"matchExpressions": [{"key": "team", "operator": "Exists", "values": ["a"]}]})),
                CelCase(CTD, f"{where}.matchExpressions[].key", "a label key must be",
                        peer({"matchExpressions": [{"key": "a.b/c_d", "operator": "Exists"}]}),
                        peer({"matchExpressions": [{"key": "a_b/c", "operator": "Exists"}]})),
            ]
        out.append(CelCase(CTD, f"spec.networkPolicy.{peers}[]", "needs namespaceSelector, podSelector or both",
                           _spec(networkPolicy={peers: [{"podSelector": {}}]}),
                           _spec(networkPolicy={peers: [{}]})))
    return out


def _window(**window: Any) -> dict[str, Any]:
    return {"name": "day", "start": "08:00", "end": "20:00", "online": 80, "offline": 20, **window}


CASES: list[CelCase] = [
    # --- ChatTTSDeployment -------------------------------------------------------------------
    CelCase(CTD, "", "metadata.name must be at most 45 characters",
            {"metadata": {"name": "a" * 45}}, {"metadata": {"name": "a" * 46}}),
    CelCase(CTD, "", "metadata.name must be a DNS-1035 label", {"metadata": {"name": "tts-v2"}},
            {"metadata": {"name": "2tts"}}),
    CelCase(CTD, "spec", "gpu.count above 1 (tensor parallel) needs engine.kind vllm",
            _spec(gpu={"memory": "8Gi", "count": 2}, engine={"kind": "vllm"}),
            _spec(gpu={"memory": "8Gi", "count": 2}, engine={"kind": "graph"})),
    CelCase(CTD, "spec", "autoscaling.batchTokenTuning needs engine.kind vllm",
            _spec(engine={"kind": "vllm"}, autoscaling={"batchTokenTuning": {"enabled": True, "cap": 8192}}),
            _spec(engine={"kind": "reference"}, autoscaling={"batchTokenTuning": {"enabled": True, "cap": 8192}})),
    CelCase(CTD, "spec.model", "exactly one weight source",
            _spec(model={"pvc": None, "hostPath": {"path": "/models"}}),
            _spec(model={"hostPath": {"path": "/models"}})),
    CelCase(CTD, "spec.model.pvc.subPath", "subPath may not contain '..'",
            _spec(model={"pvc": {"subPath": "a/..b"}}), _spec(model={"pvc": {"subPath": "a/../b"}})),
    CelCase(CTD, "spec.engine", "maxNumBatchedTokens must be at least engine.maxNumSeqs",
            _spec(engine={"maxNumSeqs": 8, "maxNumBatchedTokens": 8}),
            _spec(engine={"maxNumSeqs": 8, "maxNumBatchedTokens": 7})),
    CelCase(CTD, "spec.engine", "engine.kvCacheDtype fp8 is honoured by the vllm engine only",
            _spec(engine={"kind": "vllm", "kvCacheDtype": "fp8"}), _spec(engine={"kind": "graph", "kvCacheDtype": "fp8"}),
            expect="engine.kvCacheDtype fp8 is not honoured by the graph engine"),
    CelCase(CTD, "spec.engine", "engine.speculativeConfig is not supported",
            _spec(engine={"kind": "vllm"}), _spec(engine={"kind": "vllm", "speculativeConfig": {"method": "ngram"}})),
    CelCase(CTD, "spec.engine.extraArgs", "engine.extraArgs may not set a flag the operator manages",
            _spec(engine={"extraArgs": ["--max-num-seqs-x=1"]}), _spec(engine={"extraArgs": ["--max-num-seqs=1"]}),
            expect="engine.extraArgs may not set --max-num-seqs=1"),
    CelCase(CTD, "spec.gpu.memory", "gpu.memory must be a quantity",
            _spec(gpu={"memory": "8G"}), _spec(gpu={"memory": "8 G"})),
    CelCase(CTD, "spec.gpu.memory", "gpu.memory must be greater than zero",
            _spec(gpu={"memory": "1Gi"}), _spec(gpu={"memory": "0Gi"})),
    CelCase(CTD, "spec.gpu.memory", "gpu.memory must be at least 1Gi",
            _spec(gpu={"memory": "1024Mi"}), _spec(gpu={"memory": "1023Mi"})),
    *_selector_cases(),
    CelCase(CTD, "spec.tolerations[]", "a toleration with operator Exists must not set value",
            _spec(tolerations=[{"key": "gpu", "operator": "Exists"}]),
            _spec(tolerations=[{"key": "gpu", "operator": "Exists", "value": "a"}])),
    CelCase(CTD, "spec.tolerations[]", "a toleration without key must use operator Exists",
            _spec(tolerations=[{"operator": "Exists"}]), _spec(tolerations=[{"operator": "Equal", "value": "a"}])),
    CelCase(CTD, "spec.tolerations[]", "tolerationSeconds needs effect NoExecute",
            _spec(tolerations=[{"key": "gpu", "effect": "NoExecute", "tolerationSeconds": 30}]),
            _spec(tolerations=[{"key": "gpu", "effect": "NoSchedule", "tolerationSeconds": 30}])),
    CelCase(CTD, "spec.autoscaling", "minReplicas must not exceed autoscaling.maxReplicas",
            _auto(minReplicas=3, maxReplicas=3), _auto(minReplicas=4, maxReplicas=3)),
    CelCase(CTD, "spec.autoscaling", "maxReplicas is required when autoscaling.enabled is true",
            _auto(enabled=True, maxReplicas=3), _auto(enabled=True)),
    CelCase(CTD, "spec.autoscaling.targetSchedulerDeadlineWait", "targetSchedulerDeadlineWait must be at least 0.1ms",
            _auto(targetSchedulerDeadlineWait="1ms"), _auto(targetSchedulerDeadlineWait="0ms")),
    CelCase(CTD, "spec.autoscaling.window", "window must be at least 1s", _auto(window="1s"), _auto(window="999ms")),
    CelCase(CTD, "spec.autoscaling.staleness", "staleness must be at least 1s",
            _auto(staleness="1s"), _auto(staleness="500ms")),
    CelCase(CTD, "spec.autoscaling.forecast", "forecast.lead must not exceed forecast.period",
            _auto(forecast={"lead": "1h", "period": "1h"}), _auto(forecast={"lead": "61m", "period": "1h"})),
    CelCase(CTD, "spec.autoscaling.forecast.lead", "lead must be at least 1m",
            _auto(forecast={"lead": "1m"}), _auto(forecast={"lead": "59s"})),
    CelCase(CTD, "spec.autoscaling.forecast.period", "period must be at least 1m",
            _auto(forecast={"lead": "1m", "period": "60s"}), _auto(forecast={"lead": "1m", "period": "30s"})),
    CelCase(CTD, "spec.autoscaling.metrics", "metrics.type prometheus needs metrics.prometheus.url",
            _auto(metrics={"type": "prometheus", "prometheus": {"url": "http://prom:9090"}}),
            _auto(metrics={"type": "prometheus"})),
    CelCase(CTD, "spec.autoscaling.metrics.pods.timeout", "timeout must be at least 1ms",
            _auto(metrics={"pods": {"timeout": "1ms"}}), _auto(metrics={"pods": {"timeout": "0s"}})),
    CelCase(CTD, "spec.autoscaling.metrics.prometheus", "metrics.prometheus.query uses an unknown placeholder",
            _auto(metrics={"type": "prometheus", "prometheus": {"url": "http://prom:9090", "query": "up{ns=\"$namespace\"}"}}),
            _auto(metrics={"type": "prometheus", "prometheus": {"url": "http://prom:9090", "query": "up{ns=\"$team\"}"}})),
    CelCase(CTD, "spec.autoscaling.metrics.prometheus.url", "metrics.prometheus.url must be an http(s) URL with a host",
            _auto(metrics={"type": "prometheus", "prometheus": {"url": "https://prometheus.monitoring:9090/x"}}),
            _auto(metrics={"type": "prometheus", "prometheus": {"url": "http:///api"}})),
    CelCase(CTD, "spec.autoscaling.metrics.prometheus.timeout", "timeout must be at least 1ms",
            _auto(metrics={"type": "prometheus", "prometheus": {"url": "http://prom:9090", "timeout": "1ms"}}),
            _auto(metrics={"type": "prometheus", "prometheus": {"url": "http://prom:9090", "timeout": "0ms"}})),
    CelCase(CTD, "spec.autoscaling.batchTokenTuning", "batchTokenTuning.cap must be at least step",
            _spec(engine={"kind": "vllm"}, autoscaling={"batchTokenTuning": {"step": 1024, "cap": 1024}}),
            _spec(engine={"kind": "vllm"}, autoscaling={"batchTokenTuning": {"step": 1024, "cap": 1023}})),
    CelCase(CTD, "spec.autoscaling.batchTokenTuning", "batchTokenTuning.cap is required when",
            _spec(engine={"kind": "vllm"}, autoscaling={"batchTokenTuning": {"enabled": True, "cap": 4096}}),
            _spec(engine={"kind": "vllm"}, autoscaling={"batchTokenTuning": {"enabled": True}})),
    CelCase(CTD, "spec.autoscaling.batchTokenTuning.sustainedFor", "sustainedFor must be at least 1s",
            _auto(batchTokenTuning={"sustainedFor": "1s"}), _auto(batchTokenTuning={"sustainedFor": "10ms"})),
    CelCase(CTD, "spec.autoscaling.batchTokenTuning.quietPeriod", "quietPeriod must be at least 1s",
            _auto(batchTokenTuning={"quietPeriod": "1m"}), _auto(batchTokenTuning={"quietPeriod": "0.5s"})),
    CelCase(CTD, "spec.quantization.calibration", "quantization.calibration needs exactly one of pvc or configMap",
            _spec(model={"format": "fp16"}, quantization={"calibration": {"configMap": {"name": "cal", "key": "a.jsonl"}},
                                                          "output": {"claimName": "out"}}),
            _spec(model={"format": "fp16"}, quantization={"calibration": {}, "output": {"claimName": "out"}})),
    # --- GPUSharePolicy ----------------------------------------------------------------------
    CelCase(GSP, "spec", "window names must be unique",
            _spec(windows=[_window(), _window(name="night", start="20:00", end="08:00")]),
            _spec(windows=[_window(), _window(start="20:00", end="08:00")])),
    CelCase(GSP, "spec.nodeSelector.matchLabels", "matchLabels: a label key must be",
            _spec(nodeSelector={"matchLabels": {"nvidia.com/gpu.product": "H200"}}),
            _spec(nodeSelector={"matchLabels": {"nvidia.com/gpu product": "H200"}})),
    CelCase(GSP, "spec.nodeSelector.matchExpressions[]", "selector operators In and NotIn need values",
            _spec(nodeSelector={"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}),
            _spec(nodeSelector={"matchExpressions": [{"key": "pool", "operator": "NotIn"}]})),
    CelCase(GSP, "spec.nodeSelector.matchExpressions[]", "selector operators Exists and DoesNotExist take no values",
            _spec(nodeSelector={"matchExpressions": [{"key": "pool", "operator": "DoesNotExist"}]}),
            _spec(nodeSelector={"matchExpressions": [{"key": "pool", "operator": "DoesNotExist", "values": ["a"]}]})),
    CelCase(GSP, "spec.nodeSelector.matchExpressions[].key", "a label key must be",
            _spec(nodeSelector={"matchExpressions": [{"key": "pool", "operator": "Exists"}]}),
            _spec(nodeSelector={"matchExpressions": [{"key": "pool-", "operator": "Exists"}]})),
    CelCase(GSP, "spec.windows[]", "online + offline may not exceed 100",
            _spec(windows=[_window(online=60, offline=40)]), _spec(windows=[_window(online=60, offline=41)])),
    CelCase(GSP, "spec.windows[]", "a window's start and end must differ",
            _spec(windows=[_window(end="08:01")]), _spec(windows=[_window(end="08:00")])),
    CelCase(GSP, "spec.windows[]", "a window may not start at 24:00",
            _spec(windows=[_window(start="00:00")]), _spec(windows=[_window(start="24:00")])),
    CelCase(GSP, "spec.defaultShares", "online + offline may not exceed 100",
            _spec(defaultShares={"online": 50, "offline": 50}), _spec(defaultShares={"online": 50, "offline": 51})),
    # status.shares: written by the operator through the status subresource (tests/cluster: a status patch).
    CelCase(GSP, "status.shares", "online + offline may not exceed 100",
            {"status": {"shares": {"online": 70, "offline": 30}}}, {"status": {"shares": {"online": 70, "offline": 31}}}),
]
CASES = [CelCase(**{**c.__dict__, "id": f"{c.kind}:{c.path or '<root>'}:{c.message[:40]}:{i}"})
         for i, c in enumerate(CASES)]
