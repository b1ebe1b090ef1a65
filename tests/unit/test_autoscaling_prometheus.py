"""The ``prometheus`` metric source against a real Prometheus server (Debian's
``prometheus`` package) scraping a real exposition on loopback: the default query
template, rendered as the autoscaler renders it, returns the fleet's wait quantile.
Skipped when the ``prometheus`` binary is absent."""
from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from chattts_operator.api.autoscaling import AutoscalingSpec
from chattts_operator.autoscaling.signals import MetricError, query_prometheus
from chattts_operator.autoscaling.controller import Autoscaler
from chattts_operator.core.podhttp import PodHttp
from tests.support import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(PROMETHEUS is None, reason="needs the prometheus binary (Debian package prometheus)"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def runtime_exposition():
    """A runtime's wait histogram served over HTTP; observations keep coming while the test runs."""
    registry = CollectorRegistry()
    wait = Histogram("vllm:scheduler_deadline_wait_seconds", "wait", registry=registry,
                     buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stop = threading.Event()

    def observe():
        # 100 requests a second: 90% start within 2 ms, 10% wait 200 ms (a saturated fleet).
        i = 0
        while not stop.is_set():
            wait.observe(0.2 if i % 10 == 0 else 0.002)
            i += 1
            time.sleep(0.01)

    threading.Thread(target=observe, daemon=True).start()
    yield server.server_address[1]
    stop.set()
    server.shutdown()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, runtime_exposition):
    tmp_path = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": "chattts",
            "static_configs": [
                {"targets": [f"127.0.0.1:{runtime_exposition}"],
                 # The labels Prometheus's Kubernetes discovery gives a serving pod.
                 "labels": {"namespace": "tts", "pod": "voice-5d9f7c6b8-x2k4q"}},
            ],
        }],
    }
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # ready, and holding enough scrapes for a 5 s rate()
            if proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            try:
                query = urllib.parse.quote('count_over_time(vllm:scheduler_deadline_wait_seconds_count[10s])')
                with urllib.request.urlopen(f"{url}/api/v1/query?query={query}", timeout=2) as resp:
                    result = json.loads(resp.read())["data"]["result"]
                if result and float(result[0]["value"][1]) >= 5:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("prometheus never scraped the target")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _spec(url: str, **prometheus) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate({
        "enabled": True, "maxReplicas": 4, "window": "5s",
        "metrics": {"type": "prometheus", "prometheus": {"url": url, **prometheus}}})


def _sample(spec: AutoscalingSpec, name: str, namespace: str):
    scaler = Autoscaler.__new__(Autoscaler)  # only the HTTP session is used on this path
    scaler.http = PodHttp(allow_annotation=False)

    async def run():
        try:
            return await scaler._prometheus_sample(name, namespace, spec, time.time())
        finally:
            await scaler.http.close()

    return asyncio.run(run())


def test_default_query_returns_the_fleet_wait_quantile(prometheus):
    sample = _sample(_spec(prometheus), "voice", "tts")
    # p99 of (90% at 2 ms, 10% at 200 ms) lies in the (0.1, 0.25] bucket.
    assert sample is not None and 0.1 < sample.wait_quantile <= 0.25, sample
    assert abs(sample.time - time.time()) < 10


def test_other_deployments_pods_do_not_match(prometheus):
    # "voice-extra" is another ChatTTSDeployment's name prefix; "tts2" another namespace.
    assert _sample(_spec(prometheus), "voice-extra", "tts") is None
    assert _sample(_spec(prometheus), "voice", "tts2") is None


def test_a_query_error_is_a_metric_error(prometheus):
    spec = _spec(prometheus, query="histogram_quantile($quantile, rate(broken[")
    with pytest.raises(MetricError, match="bad_data"):
        _sample(spec, "voice", "tts")


def test_unreachable_prometheus_is_a_metric_error():
    async def run():
        import aiohttp

        async with aiohttp.ClientSession() as session:
            await query_prometheus(session, f"http://127.0.0.1:{free_port()}", "up", 2.0)

    with pytest.raises(MetricError, match="prometheus"):
        asyncio.run(run())


def test_nan_from_prometheus_holds(prometheus):
    # An idle window: rate() of an unchanging counter is 0, histogram_quantile of zeros is NaN.
    spec = _spec(prometheus, query='histogram_quantile($quantile, sum by (le) (rate('
                                   'vllm:scheduler_deadline_wait_seconds_bucket{namespace="$namespace",$selector}[$window])) * 0)')
    sample = _sample(spec, "voice", "tts")
    assert sample is not None and math.isnan(sample.wait_quantile)
    from chattts_operator.autoscaling import History, decide

    decision = decide(spec, 3, [sample], History(), sample.time)
    assert decision.desired_replicas == 3 and decision.reason == "HoldInvalidMetric"
