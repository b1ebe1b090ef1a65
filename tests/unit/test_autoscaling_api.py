"""spec.autoscaling / status.autoscaling models: defaults, bad input, durations, query templates."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from chattts_operator.api.autoscaling import (
    AutoscalingSpec,
    AutoscalingStatus,
    format_duration,
    format_time,
    parse_duration,
    parse_time,
)


def test_defaults_follow_the_hpa_and_the_issue():
    spec = AutoscalingSpec.model_validate({"enabled": True, "maxReplicas": 4})
    assert spec.target_seconds == pytest.approx(0.005)
    assert spec.window_seconds == 60 and spec.tolerance == 0.1 and spec.quantile == 0.99
    assert spec.behavior.scale_down.stabilization_window_seconds == 360
    assert spec.behavior.scale_up.stabilization_window_seconds == 0
    assert [(p.type, p.value, p.period_seconds) for p in spec.behavior.scale_up.policies] == [
        ("Percent", 100, 15), ("Pods", 4, 15)]
    assert spec.metrics.type == "pods" and spec.metrics.pods.port == 8000
    assert spec.batch_token_tuning.enabled is False


def test_camel_case_round_trip():
    data = {"enabled": True, "minReplicas": 2, "maxReplicas": 5, "targetSchedulerDeadlineWait": "20ms",
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60, "selectPolicy": "Min"}}}
    spec = AutoscalingSpec.model_validate(data)
    dumped = spec.model_dump(by_alias=True)
    assert dumped["targetSchedulerDeadlineWait"] == "20ms"
    assert dumped["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 60
    assert AutoscalingSpec.model_validate(dumped) == spec


@pytest.mark.parametrize(
    "data,message",
    [
        ({"enabled": True}, "maxReplicas is required"),
        ({"minReplicas": 3, "maxReplicas": 2}, "must not exceed"),
        ({"minReplicas": 0, "maxReplicas": 2}, "greater than or equal to 1"),
        ({"maxReplicas": 2, "targetSchedulerDeadlineWait": "5"}, "should match pattern"),
        ({"maxReplicas": 2, "targetSchedulerDeadlineWait": "0ms"}, "at least"),
        ({"maxReplicas": 2, "window": "500ms"}, "window must be at least 1s"),
        ({"maxReplicas": 2, "tolerance": 1.5}, "less than 1"),
        ({"maxReplicas": 2, "quantile": 1.0}, "less than 1"),
        ({"maxReplicas": 2, "metrics": {"type": "prometheus"}}, "needs metrics.prometheus.url"),
        ({"maxReplicas": 2, "metrics": {"type": "statsd"}}, "'pods' or 'prometheus'"),
        ({"maxReplicas": 2, "metrics": {"type": "prometheus", "prometheus": {"url": "prom:9090"}}}, "pattern"),
        ({"maxReplicas": 2, "metrics": {"type": "prometheus",
                                        "prometheus": {"url": "http://p:9090", "query": "up{job=\"$job\"}"}}},
         "unknown placeholders ['job']"),
        ({"maxReplicas": 2, "metrics": {"type": "prometheus",
                                        "prometheus": {"url": "http://p:9090", "query": "up * $"}}}, "stray '$'"),
        ({"maxReplicas": 2, "metrics": {"type": "prometheus",
                                        "prometheus": {"url": "http://p:9090", "query": "x" * 4097}}}, "at most 4096"),
        ({"maxReplicas": 2, "batchTokenTuning": {"enabled": True}}, "cap is required"),
        ({"maxReplicas": 2, "batchTokenTuning": {"step": 2048, "cap": 1024}}, "at least step"),
        ({"maxReplicas": 2, "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 15}]}}},
         "greater than or equal to 1"),
        ({"maxReplicas": 2, "replicas": 3}, "Extra inputs are not permitted"),
    ],
)
def test_bad_input_is_rejected_with_a_clear_message(data, message):
    with pytest.raises(ValidationError) as info:
        AutoscalingSpec.model_validate(data)
    assert message in str(info.value)


def test_query_template_renders():
    spec = AutoscalingSpec.model_validate(
        {"maxReplicas": 2, "metrics": {"type": "prometheus", "prometheus": {"url": "http://p:9090"}}})
    query = spec.metrics.prometheus.render_query(
        namespace="tts", name="voice", window="60s", quantile=0.99, selector='pod=~"voice-.*"')
    assert query == ('histogram_quantile(0.99, sum by (le) (rate(vllm:scheduler_deadline_wait_seconds_bucket'
                     '{namespace="tts",pod=~"voice-.*"}[60s])))')


@pytest.mark.parametrize("text,seconds", [("5ms", 0.005), ("60s", 60), ("1m30s", 90), ("1.5h", 5400), ("2h5m", 7500)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "ms", "-5ms", "5 ms", "5d", "1e3s"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds,text", [(0.0123, "12.3ms"), (0.005, "5ms"), (0, "0ms"), (1.5, "1.5s"), (90, "1.5m"), (7200, "2h")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == pytest.approx(seconds, abs=1e-6)


def test_time_round_trip():
    assert parse_time(format_time(1_700_000_000)) == 1_700_000_000
    assert format_time(0) == "1970-01-01T00:00:00Z"


def test_cel_rules_are_in_the_json_schema():
    schema = AutoscalingSpec.model_json_schema(by_alias=True)
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert "!has(self.maxReplicas) || self.minReplicas <= self.maxReplicas" in rules
    assert any("has(self.prometheus)" in r["rule"] for r in schema["$defs"]["MetricSource"]["x-kubernetes-validations"])


def test_status_ignores_unknown_fields_and_round_trips():
    status = AutoscalingStatus.model_validate({
        "currentMetric": "3ms", "desiredReplicas": 2, "somethingNew": 1,
        "decisions": [{"time": "2026-11-30T00:00:00Z", "currentReplicas": 1, "desiredReplicas": 2, "reason": "ScaleUp"}],
    })
    assert status.decisions[0].desired_replicas == 2
    assert "somethingNew" not in status.model_dump(by_alias=True)
