"""The fuzz tier: schemathesis from the runtime's own OpenAPI schema, and hypothesis property tests over
the speech request body. No input may yield a 5xx or a hang, and /health answers throughout.

Bounded: a fixed number of examples each, every request with a timeout, loopback only.
"""
from __future__ import annotations

import json

import httpx
import pytest

hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rt_helpers import launch_server, stop_server, tiny_server_config  # noqa: E402

pytestmark = pytest.mark.slow
REQUEST_TIMEOUT = 30.0
FUZZ_SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, tiny_checkpoint):
    srv = launch_server(tiny_server_config(
        tiny_checkpoint, server={"body_timeout_seconds": 2, "max_queue": 64},
        generation={"max_new_frames": 8, "stream_chunk_frames": 4}), tmp_path_factory.mktemp("fuzz"))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def api_schema(fuzz_server):
    return schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")


def assert_healthy(srv) -> None:
    assert httpx.get(srv.url + "/health", timeout=5).status_code == 200


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_schema_driven_requests_never_5xx(api_schema, fuzz_server, mode):
    """Cases for every operation in the schema: valid ones (positive) and ones that break it (negative)."""
    from schemathesis.generation import GenerationMode

    strategy = api_schema.as_strategy(GenerationMode(mode))
    seen = []

    @FUZZ_SETTINGS
    @given(case=strategy)
    def run(case):
        response = case.call(base_url=fuzz_server.url, timeout=REQUEST_TIMEOUT)
        assert response.status_code < 500, (case.as_curl_command(), response.text[:300])
        seen.append(case.path)
        assert_healthy(fuzz_server)

    run()
    assert "/v1/audio/speech" in seen


def test_the_schema_describes_the_speech_body(api_schema):
    body = api_schema.raw_schema["paths"]["/v1/audio/speech"]["post"]["requestBody"]
    props = body["content"]["application/json"]["schema"]["properties"]
    assert {"model", "input", "voice", "response_format", "stream_format", "seed"} <= set(props)


JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
PLAUSIBLE = {
    "model": st.sampled_from(["chattts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts", "", "x" * 300]),
    "input": st.text(max_size=80) | st.sampled_from(["hello", "\ud800", "你好", "[" * 30]),
    "voice": st.sampled_from(["alloy", "nova", "", "\u4e00" * 20, "\u4e00" * 5000]) | st.text(max_size=30),
    "response_format": st.sampled_from(["wav", "pcm", "mp3", "opus", "aac", "flac", "ogg", ""]),
    "speed": st.floats() | st.integers(),
    "stream": st.booleans() | JSON_SCALARS,
    "stream_format": st.sampled_from(["audio", "sse", "none", None]),
    "temperature": st.floats() | st.integers(), "top_p": st.floats(), "top_k": st.integers(),
    "seed": st.integers() | st.floats(),
}
BODIES = st.fixed_dictionaries({}, optional={k: v | JSON_VALUES for k, v in PLAUSIBLE.items()}).flatmap(
    lambda known: st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=3).map(lambda extra: {**extra, **known}))


@FUZZ_SETTINGS
@given(body=BODIES)
def test_any_json_body_answers_without_5xx(fuzz_server, body):
    # allow_nan: NaN and Infinity literals, which Python's parser accepts, are part of the attack surface
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    r = httpx.post(fuzz_server.url + "/v1/audio/speech", content=raw, timeout=REQUEST_TIMEOUT,
                   headers={"content-type": "application/json"})
    assert r.status_code < 500, (raw[:300], r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and len(r.content) < 1024
    assert_healthy(fuzz_server)


@FUZZ_SETTINGS
@given(raw=st.binary(max_size=300) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_bytes_answer_4xx(fuzz_server, raw):
    r = httpx.post(fuzz_server.url + "/v1/audio/speech", content=raw, timeout=REQUEST_TIMEOUT,
                   headers={"content-type": "application/json"})
    assert r.status_code < 500, (raw[:300], r.text[:300])
    assert_healthy(fuzz_server)
