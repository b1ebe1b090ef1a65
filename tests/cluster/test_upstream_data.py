"""The UpstreamData condition against the real control plane: the operator (subprocess) asks a Ready
serving pod's /health which upstream data the runtime found and says so on the ChatTTSDeployment.

kwok pods serve nothing, so the pod is pointed at an HTTP server on loopback with the
``tts.chattts.io/metrics-url`` annotation (honoured with CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION=1,
the same address the autoscaler scrapes), as tests/cluster/test_autoscaling_e2e.py does. The
server answers the runtime's /health shape: first with a normalizer missing, then with none.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from tests.cluster.helpers import INSTANCE, apply, get
from tests.support import ctd, wait_until

METRICS_URL_ANNOTATION = "tts.chattts.io/metrics-url"


class FakeRuntimeHealth(ThreadingHTTPServer):
    """/health as chattts_runtime.server answers it; ``missing`` is what start-up did not find."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.missing: list[str] = ["normalizer_en"]
        self.asked = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeRuntimeHealth

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path != "/health":
            self.send_error(404)
            return
        self.server.asked += 1
        body = json.dumps({"status": "ok", "upstream_data": {
            "homophones": "/models/chattts/homophones_map.json", "speaker_stats": "/models/chattts/asset/spk_stat.pt",
            "normalizers": {"zh": "wetext"} if self.server.missing else {"zh": "wetext", "en": "nemo"},
            "missing": list(self.server.missing)}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[FakeRuntimeHealth]:
    server = FakeRuntimeHealth()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def upstream(kubectl, namespace: str, status: str) -> dict[str, Any] | None:
    obj = get(kubectl, namespace, "ctd", "voice")
    c = conditions(obj).get("UpstreamData")
    return obj if c and c["status"] == status else None


def ready_pod(kubectl, namespace: str, not_this: str | None = None) -> str | None:
    pods = get(kubectl, namespace, "pods", "-l", f"{INSTANCE}=voice")["items"]
    for pod in pods:
        if pod["metadata"].get("deletionTimestamp") or pod["metadata"]["name"] == not_this:
            continue
        if any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or []):
            assert METRICS_URL_ANNOTATION in pod["metadata"].get("annotations", {})
            return pod["metadata"]["name"]
    return None


def serve_from_loopback(kubectl, namespace: str, url: str) -> str:
    """Scale ChatTTSDeployment voice (at 0) to one pod that carries the loopback address from its
    first moment (a pod template annotation of the test's own field manager, which the operator's
    apply leaves alone): no question goes to a kwok pod's made-up IP. Its name, once Ready."""
    wait_until(lambda: kubectl("get", "deploy", "voice", "-n", namespace, check=False).returncode == 0,
               "the Deployment", timeout=60)
    kubectl("patch", "deploy", "voice", "-n", namespace, "--type=merge", "-p", json.dumps(
        {"spec": {"template": {"metadata": {"annotations": {METRICS_URL_ANNOTATION: f"{url}/metrics"}}}}}))
    kubectl("patch", "ctd", "voice", "-n", namespace, "--type=merge", "-p", '{"spec": {"replicas": 1}}')
    return wait_until(lambda: ready_pod(kubectl, namespace), "a Ready serving pod", timeout=120)


def start_asking(operators, interval_seconds: str):
    """An operator that asks pods for their upstream data every ``interval_seconds`` and honours the
    metrics-url annotation (the loopback /health stands in for a kwok pod's address)."""
    op = operators(upstream_data_interval_seconds=interval_seconds)
    op.env["CHATTTS_AUTOSCALER_METRICS_URL_ANNOTATION"] = "1"
    op.start()
    return op


def test_a_missing_normalizer_is_a_condition_then_found(crds, namespace, health_server, operators):
    kubectl = crds.kubectl
    start_asking(operators, interval_seconds="1")
    apply(kubectl, namespace, ctd("voice", replicas=0))

    # No pod to ask: Unknown.
    obj = wait_until(lambda: upstream(kubectl, namespace, "Unknown"), "UpstreamData=Unknown", timeout=60)
    assert conditions(obj)["UpstreamData"]["reason"] in ("NotChecked", "NoReadyPod")
    wait_until(lambda: conditions(get(kubectl, namespace, "ctd", "voice"))["UpstreamData"]["reason"] == "NoReadyPod",
               "UpstreamData=Unknown/NoReadyPod", timeout=30)
    pod = serve_from_loopback(kubectl, namespace, health_server.url)

    obj = wait_until(lambda: upstream(kubectl, namespace, "False"), "UpstreamData=False", timeout=60)
    c = conditions(obj)
    assert c["UpstreamData"]["reason"] == "UpstreamDataMissing"
    assert f"pod {pod} did not find normalizer_en" in c["UpstreamData"]["message"]
    assert c["UpstreamData"]["observedGeneration"] == obj["metadata"]["generation"]
    # Informational: the object is Ready all the same.
    assert c["Ready"]["status"] == "True" and obj["status"]["phase"] == "Ready"
    events = get(kubectl, namespace, "events", "--field-selector", "involvedObject.name=voice")["items"]
    assert any(e["reason"] == "UpstreamDataFalse" and e["type"] == "Warning" for e in events)

    # The runtime now finds everything (e.g. a new image): the next question says so.
    health_server.missing = []
    obj = wait_until(lambda: upstream(kubectl, namespace, "True"), "UpstreamData=True", timeout=60)
    c = conditions(obj)
    assert c["UpstreamData"]["reason"] == "Found" and c["Ready"]["status"] == "True"

    # Unchanged answers write nothing: the object's resourceVersion stays put while it is asked again.
    version = obj["metadata"]["resourceVersion"]
    asked = health_server.asked
    wait_until(lambda: health_server.asked >= asked + 3, "three more questions", timeout=30)
    assert get(kubectl, namespace, "ctd", "voice")["metadata"]["resourceVersion"] == version


def test_a_pod_that_becomes_ready_is_asked_at_once(crds, namespace, health_server, operators):
    """No periodic pass within the test (the interval is 10 minutes): a pod becoming Ready is the trigger."""
    kubectl = crds.kubectl
    start_asking(operators, interval_seconds="600")
    apply(kubectl, namespace, ctd("voice", replicas=0))
    pod = serve_from_loopback(kubectl, namespace, health_server.url)
    obj = wait_until(lambda: upstream(kubectl, namespace, "False"), "UpstreamData=False", timeout=30)
    assert f"pod {pod} did not find normalizer_en" in conditions(obj)["UpstreamData"]["message"]

    # The pod is replaced (say, by a rollout of a fixed image): its successor, once Ready, is asked.
    health_server.missing = []
    kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")
    wait_until(lambda: ready_pod(kubectl, namespace, not_this=pod), "the next pod Ready", timeout=120)
    obj = wait_until(lambda: upstream(kubectl, namespace, "True"), "UpstreamData=True", timeout=30)
    assert conditions(obj)["UpstreamData"]["reason"] == "Found"
