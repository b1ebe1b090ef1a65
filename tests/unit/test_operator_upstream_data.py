"""The UpstreamData condition, pure: a Ready pod's /health (or why it could not be read) -> the
condition; it never changes Ready, Degraded or phase. And the pods' address the /health question
shares with the autoscaler's scrape (core/podhttp.py)."""
from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from chattts_operator.core.podhttp import PodHttp, PodHttpError, pod_url
from chattts_operator.deployment.status import HealthAnswer, Observed, compute_status, transitions, upstream_data_condition
from tests.support import free_port
from tests.unit.test_operator_reconcile import T0, T1, desired_of, live_deployment, obj

FOUND = {"homophones": "/models/chattts/homophones_map.json", "speaker_stats": "/models/chattts/asset/spk_stat.pt",
         "normalizers": {"zh": "wetext", "en": "nemo"}, "missing": []}


def health(**data):
    return {"status": "ok", "upstream_data": {**FOUND, **data}}


def test_missing_items_are_false_naming_them_and_the_pod():
    c = upstream_data_condition(HealthAnswer("tts-7d9f-abcde", health(missing=["homophones", "normalizer_en"])), 3)
    assert (c["type"], c["status"], c["reason"], c["observedGeneration"]) == ("UpstreamData", "False",
                                                                            "UpstreamDataMissing", 3)
    assert "pod tts-7d9f-abcde did not find homophones, normalizer_en" in c["message"]
    assert "English digits, dates and amounts are dropped" in c["message"]
    assert "rare Chinese characters" in c["message"]
    # An item this operator does not know yet is named all the same.
    later = upstream_data_condition(HealthAnswer("p", health(missing=["something_new"])), 1)
    assert later["status"] == "False" and "did not find something_new (something_new)" in later["message"]


def test_nothing_missing_is_true():
    c = upstream_data_condition(HealthAnswer("tts-7d9f-abcde", health()), 2)
    assert (c["status"], c["reason"], c["observedGeneration"]) == ("True", "Found", 2)


@pytest.mark.parametrize("answer, reason, words", [
    (HealthAnswer(None), "NoReadyPod", "no Ready serving pod"),
    (HealthAnswer("p1", error="http://10.0.0.5:8000/health: TimeoutError"), "HealthUnreadable",
     "pod p1: http://10.0.0.5:8000/health: TimeoutError"),
    (HealthAnswer("p1", health={"status": "ok"}), "NotReported", "pod p1's /health does not say"),
    (HealthAnswer("p1", health={"status": "ok", "upstream_data": None}), "NotReported", "does not say"),
    (HealthAnswer("p1", health={"upstream_data": {"missing": "homophones"}}), "NotReported", "does not say"),
    (HealthAnswer("p1", health=["not", "an", "object"]), "NotReported", "does not say"),
])
def test_no_answer_is_unknown(answer, reason, words):
    c = upstream_data_condition(answer, 1)
    assert (c["status"], c["reason"]) == ("Unknown", reason) and words in c["message"]


def _cond(status, ctype):
    return next(c for c in status["conditions"] if c["type"] == ctype)


def test_informational_it_never_changes_ready_or_phase():
    d = desired_of(obj())
    ready = Observed(live_deployment(d), deployment_applied=True)
    base = compute_status(d, ready, None, T0)
    missing = compute_status(d, Observed(live_deployment(d), deployment_applied=True,
                                         upstream=HealthAnswer("p1", health(missing=["speaker_stats"]))), None, T0)
    assert _cond(missing, "UpstreamData")["status"] == "False"
    for key in ("phase", "observedGeneration", "readyReplicas"):
        assert missing[key] == base[key]
    for ctype in ("Ready", "Progressing", "Degraded"):
        assert _cond(missing, ctype) == _cond(base, ctype)
    # Found on a Deployment that is not Ready leaves it not Ready.
    not_ready = compute_status(d, Observed(live_deployment(d, ready=0), deployment_applied=True,
                                           upstream=HealthAnswer("p1", health())), None, T0)
    assert _cond(not_ready, "UpstreamData")["status"] == "True" and _cond(not_ready, "Ready")["status"] == "False"
    # A missing item is a Warning event; finding it later a Normal one.
    found = compute_status(d, Observed(live_deployment(d), deployment_applied=True,
                                       upstream=HealthAnswer("p1", health())), missing, T1)
    assert ("Warning", "UpstreamDataFalse") in [e[:2] for e in transitions(base["conditions"], missing["conditions"])]
    assert ("Normal", "UpstreamDataTrue") in [e[:2] for e in transitions(missing["conditions"], found["conditions"])]
    assert _cond(found, "UpstreamData")["lastTransitionTime"] == T1


def test_not_asked_yet_keeps_what_an_earlier_process_found():
    d = desired_of(obj())
    first = compute_status(d, Observed(live_deployment(d), deployment_applied=True), None, T0)
    assert (_cond(first, "UpstreamData")["status"], _cond(first, "UpstreamData")["reason"]) == ("Unknown", "NotChecked")
    found = compute_status(d, Observed(live_deployment(d), deployment_applied=True,
                                       upstream=HealthAnswer("p1", health())), first, T0)
    # A restarted operator has not asked yet: the condition found before stands, no write.
    again = compute_status(d, Observed(live_deployment(d), deployment_applied=True), found, T1)
    assert _cond(again, "UpstreamData") == _cond(found, "UpstreamData")


def test_the_health_url_shares_the_autoscalers_pod_address():
    pod = {"metadata": {"name": "p", "annotations": {"tts.chattts.io/metrics-url": "http://127.0.0.1:5/metrics"}},
           "status": {"podIP": "10.0.0.5"}}
    assert pod_url(pod, "/health", scheme="http", port=8000, allow_annotation=False) == "http://10.0.0.5:8000/health"
    # The annotation (tests and development only) names the address; the endpoint's path is kept.
    assert pod_url(pod, "/health", scheme="http", port=8000, allow_annotation=True) == "http://127.0.0.1:5/health"
    assert pod_url(pod, "/metrics", scheme="http", port=8000, allow_annotation=True) == "http://127.0.0.1:5/metrics"
    v6 = {"metadata": {"name": "p"}, "status": {"podIP": "fd00::5"}}
    assert pod_url(v6, "/health", scheme="http", port=8000, allow_annotation=True) == "http://[fd00::5]:8000/health"
    assert pod_url({"metadata": {"name": "p"}, "status": {}}, "/health", scheme="http", port=8000,
                   allow_annotation=False) is None


class _Answers(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        code, body = {"/health": (200, b'{"status": "ok", "upstream_data": {"missing": []}}'),
                      "/broken": (500, b"oops"), "/text": (200, b"not json")}.get(self.path, (404, b""))
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_get_json_over_loopback_and_its_errors():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    closed = f"http://127.0.0.1:{free_port()}/health"

    async def run():
        http = PodHttp(allow_annotation=False)
        try:
            answers = [await http.get_json(base + "/health", 2)]
            for url in (base + "/broken", base + "/text", closed):
                with pytest.raises(PodHttpError) as err:
                    await http.get_json(url, 2)
                answers.append(str(err.value))
            return answers
        finally:
            await http.close()

    try:
        answers = asyncio.run(run())
    finally:
        server.shutdown()
        server.server_close()
    assert answers[0] == {"status": "ok", "upstream_data": {"missing": []}}
    assert answers[1] == f"{base}/broken: HTTP 500"
    assert answers[2].startswith(f"{base}/text: ") and answers[3].startswith(f"{closed}: ")
