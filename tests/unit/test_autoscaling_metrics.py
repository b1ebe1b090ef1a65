"""Metric readers: parsing real prometheus_client expositions, histogram quantiles, the
fleet aggregation, Prometheus API responses, a real HTTP scrape on loopback, and the
status bookkeeping."""
from __future__ import annotations

import asyncio
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from chattts_operator.api.autoscaling import AutoscalingSpec
from chattts_operator.autoscaling import History, decide
from chattts_operator.autoscaling.signals import (
    MetricError,
    PodScrape,
    fleet_sample,
    histogram_quantile,
    parse_pod_metrics,
    parse_prometheus_response,
    scrape_pods,
)
from chattts_operator.autoscaling.status import history_from_status, next_status, status_patch, worth_writing
from chattts_operator.autoscaling.controller import pod_metrics_urls, replica_cap

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)


class RuntimeMetrics:
    """The runtime's metric families, as a real prometheus_client registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.wait = Histogram("vllm:scheduler_deadline_wait_seconds", "wait", ["model_name"],
                              buckets=BUCKETS, registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "running", ["model_name"], registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "waiting", ["model_name"], registry=self.registry)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_parse_real_exposition_sums_label_sets():
    m = RuntimeMetrics()
    for value in (0.0005, 0.002, 0.02):
        m.wait.labels("a").observe(value)
    m.wait.labels("b").observe(0.2)
    m.running.labels("a").set(3)
    m.running.labels("b").set(2)
    m.waiting.labels("a").set(1)
    scrape = parse_pod_metrics(m.text(), 100.0)
    assert scrape.count == 4
    assert dict(scrape.buckets)[0.001] == 1 and dict(scrape.buckets)[math.inf] == 4
    assert scrape.running == 5 and scrape.waiting == 1


def test_parse_prefers_the_runtime_gauges():
    m = RuntimeMetrics()
    m.wait.labels("a").observe(0.001)
    m.running.labels("a").set(9)
    m.waiting.labels("a").set(2)
    own = Gauge("chattts_requests_running", "running", registry=m.registry)
    own.set(4)
    scrape = parse_pod_metrics(m.text(), 0.0)
    assert scrape.running == 4  # chattts_requests_running wins over vllm:num_requests_running
    assert scrape.waiting == 2  # no chattts_requests_waiting: vllm:num_requests_waiting


@pytest.mark.parametrize("text", ["", "# only a comment\n", "vllm:num_requests_running 3\n"])
def test_parse_without_the_histogram_is_an_error(text):
    with pytest.raises(MetricError, match="no vllm:scheduler_deadline_wait_seconds"):
        parse_pod_metrics(text, 0.0)


def test_parse_garbage_is_an_error():
    with pytest.raises(MetricError):
        parse_pod_metrics("vllm:num_requests_running{ 3\n", 0.0)


@pytest.mark.parametrize(
    "buckets,q,expected",
    [
        ([(0.01, 50), (0.02, 100), (math.inf, 100)], 0.5, 0.01),
        ([(0.01, 50), (0.02, 100), (math.inf, 100)], 0.75, 0.015),
        ([(0.01, 0), (0.02, 0), (math.inf, 0)], 0.99, math.nan),
        ([(0.01, 99), (math.inf, 100)], 0.999, 0.01),  # rank in +Inf: the highest finite bound
        ([(0.005, 100), (math.inf, 100)], 0.99, 0.00495),
    ],
)
def test_histogram_quantile_matches_prometheus(buckets, q, expected):
    value = histogram_quantile(q, buckets)
    if math.isnan(expected):
        assert math.isnan(value)
    else:
        assert value == pytest.approx(expected)


def _scrape(t, counts, running=2.0, waiting=0.0):
    bounds = list(BUCKETS) + [math.inf]
    return PodScrape(t, tuple(zip(bounds, counts)), counts[-1], running, waiting)


def test_fleet_sample_uses_the_window_delta_across_pods():
    zeros = [0] * 10
    history = {
        "a": [_scrape(0, zeros), _scrape(60, [90, 90, 99, 100, 100, 100, 100, 100, 100, 100], 3, 1)],
        "b": [_scrape(0, [50] * 10), _scrape(60, [50, 50, 50, 50, 50, 50, 50, 150, 150, 150], 4, 0)],
    }
    sample = fleet_sample(history, 60.0, 60.0, 0.99, unreachable=1, slots_per_replica=16)
    assert sample.observed_requests == 200
    assert 0.1 < sample.wait_quantile <= 0.5  # pod b's 100 slow requests dominate p99
    assert sample.requests_running == 7 and sample.requests_waiting == 1
    assert sample.ready_replicas == 2 and sample.unreachable_replicas == 1


def test_fleet_sample_first_scrape_has_no_wait_yet():
    sample = fleet_sample({"a": [_scrape(0, [5] * 10)]}, 0.0, 60.0, 0.99, 0, 16)
    assert sample.wait_quantile is None and sample.observed_requests is None
    assert sample.requests_running == 2


def test_fleet_sample_idle_window_is_nan_with_zero_observed_and_decides_idle():
    history = {"a": [_scrape(0, [5] * 10, running=0), _scrape(30, [5] * 10, running=0)]}
    sample = fleet_sample(history, 30.0, 60.0, 0.99, 0, 16)
    assert math.isnan(sample.wait_quantile) and sample.observed_requests == 0
    spec = AutoscalingSpec.model_validate({"enabled": True, "maxReplicas": 4,
                                           "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}})
    assert decide(spec, 3, [sample], History(), 30.0).desired_replicas == 1


def test_fleet_sample_counter_reset_counts_from_zero():
    history = {"a": [_scrape(0, [100] * 10), _scrape(30, [3, 3, 3, 3, 3, 3, 3, 3, 3, 4])]}
    sample = fleet_sample(history, 30.0, 60.0, 0.99, 0, 16)
    assert sample.observed_requests == 4


@pytest.mark.parametrize(
    "payload,expected",
    [
        ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1700000000.5, "0.004"]}]}},
         (0.004, 1700000000.5)),
        ({"status": "success", "data": {"resultType": "scalar", "result": [1700000000, "NaN"]}}, (math.nan, 1700000000)),
        ({"status": "success", "data": {"resultType": "vector", "result": []}}, None),
    ],
)
def test_prometheus_responses(payload, expected):
    result = parse_prometheus_response(payload)
    if expected is None or not math.isnan(expected[0]):
        assert result == expected
    else:
        assert math.isnan(result[0]) and result[1] == expected[1]


@pytest.mark.parametrize(
    "payload,message",
    [
        ({"status": "error", "errorType": "bad_data", "error": "parse error"}, "bad_data: parse error"),
        ({"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "1"]}, {"value": [1, "2"]}]}},
         "returned 2 series"),
        ({"status": "success", "data": {"resultType": "matrix", "result": []}}, "unsupported result type"),
        ({"status": "success", "data": {"resultType": "vector", "result": [{"value": [1]}]}}, "malformed"),
    ],
)
def test_prometheus_bad_responses(payload, message):
    with pytest.raises(MetricError, match=message):
        parse_prometheus_response(payload)


def test_scrape_pods_over_loopback_reports_failures_per_pod():
    metrics = RuntimeMetrics()
    metrics.wait.labels("chattts").observe(0.003)
    metrics.running.labels("chattts").set(1)
    metrics.waiting.labels("chattts").set(0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = metrics.text().encode() if self.path == "/metrics" else b"nope"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    async def run():
        import aiohttp

        async with aiohttp.ClientSession() as session:
            return await scrape_pods(session, {
                "good": f"http://127.0.0.1:{port}/metrics",
                "missing": f"http://127.0.0.1:{port}/other",
                "closed": "http://127.0.0.1:9/metrics",
            }, timeout=2.0, now=5.0)

    try:
        scrapes, errors = asyncio.run(run())
    finally:
        server.shutdown()
    assert set(scrapes) == {"good"} and scrapes["good"].count == 1
    assert "HTTP 404" in errors["missing"]
    assert "closed" in errors


def _pod(name, ready=True, ip="10.0.0.5", annotations=None, deleting=False):
    meta = {"name": name, "annotations": annotations or {}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    return {"metadata": meta, "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_pod_metrics_urls():
    spec = AutoscalingSpec.model_validate({"maxReplicas": 3, "metrics": {"pods": {"port": 9000}}})
    pods = [_pod("a"), _pod("b", ready=False), _pod("c", deleting=True), _pod("d", ip="fd00::1"),
            _pod("e", annotations={"tts.chattts.io/metrics-url": "http://127.0.0.1:5/metrics"})]
    assert pod_metrics_urls(pods, spec, allow_annotation=False) == {
        "a": "http://10.0.0.5:9000/metrics", "d": "http://[fd00::1]:9000/metrics", "e": "http://10.0.0.5:9000/metrics"}
    assert pod_metrics_urls(pods, spec, allow_annotation=True)["e"] == "http://127.0.0.1:5/metrics"


@pytest.mark.parametrize("value,expected", [(None, None), ("3", 3), ("-1", None), ("x", None)])
def test_replica_cap(value, expected):
    annotations = {} if value is None else {"tts.chattts.io/replica-cap": value}
    assert replica_cap({"metadata": {"annotations": annotations}}) == expected


def test_status_records_decisions_conditions_and_history():
    spec = AutoscalingSpec.model_validate({"enabled": True, "maxReplicas": 5})
    from chattts_operator.autoscaling import FleetSample

    up = decide(spec, 1, [FleetSample(1000.0, 0.02, 50, 1, 0, 16, 8, 16)], History(), 1000.0)
    status = next_status(None, up, 1, 1000.0)
    assert status.decisions[-1].reason == "ScaleUp" and status.desired_replicas == up.desired_replicas
    assert status.last_scale_time == "1970-01-01T00:16:40Z"
    assert {c.type: c.status for c in status.conditions} == {"ScalingActive": "True", "AbleToScale": "True",
                                                            "ScalingLimited": "False"}
    assert history_from_status(status) == up.history

    hold = decide(spec, up.desired_replicas, [], up.history, 1015.0)
    held = next_status(status, hold, up.desired_replicas, 1015.0)
    assert held.decisions[-1].reason == "HoldMissingMetric"
    active = next(c for c in held.conditions if c.type == "ScalingActive")
    assert active.status == "False" and active.reason == "MissingMetric"
    assert worth_writing(status, held)
    again = next_status(held, decide(spec, up.desired_replicas, [], up.history, 1030.0), up.desired_replicas, 1030.0)
    assert len(again.decisions) == len(held.decisions)  # a repeated hold adds no record
    assert not worth_writing(held, again)

    stamped = next_status(None, up, 1, 1000.0, generation=7)  # the conditions say which spec they judged
    assert {c.observed_generation for c in stamped.conditions} == {7}
    assert all(c.model_dump(by_alias=True)["observedGeneration"] == 7 for c in stamped.conditions)

    failed = next_status(None, up, 1, 1000.0, scale_error="Forbidden")
    assert failed.decisions[-1].reason == "ScaleFailed" and failed.scale_events == []
    assert next(c for c in failed.conditions if c.type == "AbleToScale").status == "False"


def test_status_keeps_only_the_last_decisions():
    spec = AutoscalingSpec.model_validate({"enabled": True, "maxReplicas": 50,
                                           "behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 1}]}}})
    from chattts_operator.autoscaling import FleetSample

    status, history, current = None, History(), 1
    for i in range(15):
        now = 1000.0 + 15 * i
        d = decide(spec, current, [FleetSample(now, 0.02, 50, current, 0, 200.0, 100.0, 16)], history, now)
        status, history, current = next_status(status, d, current, now), d.history, d.desired_replicas
    assert len(status.decisions) == 10
    assert status.decisions[-1].desired_replicas == current == 16


def test_status_patch_nulls_what_became_empty():
    from chattts_operator.api.autoscaling import AutoscalingStatus, BatchTokenTuningStatus

    status = AutoscalingStatus(desired_replicas=2, batch_token_tuning=BatchTokenTuningStatus(
        max_num_batched_tokens=None, last_change_time="2026-11-30T00:00:00Z"))
    patch = status_patch(status)
    assert patch["desiredReplicas"] == 2 and patch["currentMetric"] is None and patch["lastScaleTime"] is None
    assert patch["batchTokenTuning"] == {"lastChangeTime": "2026-11-30T00:00:00Z", "maxNumBatchedTokens": None,
                                         "aboveTargetSince": None, "quietSince": None}
    assert patch["decisions"] == [] and patch["conditions"] == []


def _ctd(rv: str, enabled=True, replicas=1, deleting=False):
    meta = {"name": "v", "namespace": "ns", "uid": "u1", "resourceVersion": rv}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    return {"metadata": meta, "spec": {"replicas": replicas, "autoscaling": {"enabled": enabled, "maxReplicas": 3}}}


def test_observe_keeps_the_newest_object_and_forgets_disabled_ones():
    from chattts_operator.autoscaling.controller import Autoscaler, is_newer

    scaler = Autoscaler.__new__(Autoscaler)  # no client needed for the bookkeeping
    scaler.bodies, scaler.states = {}, {}
    scaler.observe(_ctd("10", replicas=3), deleted=False)
    scaler.observe(_ctd("9", replicas=1), deleted=False)  # a trailing watch event: ignored
    assert scaler.bodies[("ns", "v")]["spec"]["replicas"] == 3
    scaler.observe(_ctd("11", replicas=2), deleted=False)
    assert scaler.bodies[("ns", "v")]["spec"]["replicas"] == 2
    scaler.observe(_ctd("12", enabled=False), deleted=False)
    assert scaler.bodies == {}
    scaler.observe(_ctd("13"), deleted=False)
    scaler.observe(_ctd("14", deleting=True), deleted=False)
    assert scaler.bodies == {}
    assert is_newer(_ctd("abc"), _ctd("abd")) and not is_newer(_ctd("5"), _ctd("5"))
