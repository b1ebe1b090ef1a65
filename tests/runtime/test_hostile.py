"""Hostile and careless clients (issue 17): every case answers a bounded 4xx in OpenAI's shape, fast,
and the server stays healthy. One real server on loopback (tiny endless checkpoint)."""
from __future__ import annotations

import json
import lzma
import signal
import socket
import time

import httpx
import pytest

from rt_helpers import launch_server, speech, stop_server, tiny_server_config

SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def server(tmp_path_factory, endless_checkpoint):
    srv = launch_server(tiny_server_config(
        endless_checkpoint, server={"body_timeout_seconds": 1.5, "max_queue": 32},
        generation={"max_new_frames": 48, "stream_chunk_frames": 12}), tmp_path_factory.mktemp("hostile"))
    yield srv
    stop_server(srv)


def counted(srv, status: str) -> float:
    for s in srv.metrics().get("chattts_requests", []):
        if s.name == "chattts_requests_total" and s.labels.get("status") == status:
            return s.value
    return 0.0


def gauge(srv, name: str) -> float:
    return next(s.value for samples in srv.metrics().values() for s in samples if s.name == name)


def post_raw(srv, body: bytes, **headers) -> httpx.Response:
    with srv.client(timeout=10) as c:
        return c.post(SPEECH, content=body, headers={"content-type": "application/json", **headers})


def assert_openai_error(r: httpx.Response, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param
    if code is not None:
        assert err["code"] == code
    assert len(r.content) < 1024  # bounded, whatever the input
    return err


def assert_serving(srv) -> None:
    with srv.client() as c:
        assert c.get("/health").status_code == 200
        assert speech(c, input="still serving", response_format="pcm").status_code == 200


def raw_http(srv, head: bytes, body: bytes = b"", read_timeout: float = 10.0) -> tuple[bytes, float]:
    """Send bytes on a fresh loopback socket; (the answer, seconds until it came)."""
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        start = time.monotonic()
        sock.sendall(head + body)
        answer = sock.recv(65536)
        seconds = time.monotonic() - start
        header, _, rest = answer.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in header.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(rest) < length:
            more = sock.recv(65536)
            if not more:
                break
            rest += more
        return header + b"\r\n\r\n" + rest, seconds


def test_lone_surrogate_in_input_is_a_400(server):
    body = b'{"model": "chattts", "voice": "alloy", "input": "hi \\ud800 there"}'
    assert_openai_error(post_raw(server, body), 400, param="input", code="invalid_unicode")
    key = b'{"model": "chattts", "voice": "alloy", "input": "hi", "\\udc00": 1}'
    assert_openai_error(post_raw(server, key), 400, code="invalid_unicode")
    assert_serving(server)


def test_deep_json_nesting_is_a_fast_400(server):
    depth = 100_000
    body = b'{"model": "chattts", "voice": "alloy", "input": ' + b"[" * depth + b"]" * depth + b"}"
    start = time.monotonic()
    assert_openai_error(post_raw(server, body), 400, code="invalid_json")
    assert time.monotonic() - start < 5
    # brackets inside strings are text, not nesting
    text = "hello " + "[" * 40 + "{" * 40
    assert speech(server.client(), input=text, response_format="pcm").status_code == 200


@pytest.mark.parametrize("field,value", [("seed", 2**64), ("seed", -(2**64)), ("seed", 10**30),
                                         ("top_k", 2**40), ("speed", 1e308), ("temperature", -1)])
def test_numbers_out_of_range_are_400s(server, field, value):
    with server.client() as c:
        r = c.post(SPEECH, json={"model": "chattts", "voice": "alloy", "input": "hi", field: value})
    assert_openai_error(r, 400, param=field)


def test_numbers_too_long_for_json_are_400s(server):
    body = b'{"model": "chattts", "voice": "alloy", "input": "hi", "seed": ' + b"9" * 5000 + b"}"
    assert_openai_error(post_raw(server, body), 400, code="invalid_json")
    assert_openai_error(post_raw(server, b'{"model": "chattts", "seed": 1e999999, "input": "x", "voice": "alloy"}'),
                        400)


def _speaker_string(raw: bytes) -> str:
    from chattts_runtime.model.speaker import _LZMA_FILTERS, b16384_encode

    return b16384_encode(lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))


def test_speaker_strings_odd_length_bomb_or_too_long_are_400s(server):
    with server.client() as c:
        odd = _speaker_string(b"\x01" * 1537)  # decodes to an odd number of bytes
        assert_openai_error(speech(c, input="hi", voice=odd), 400, param="voice")
        bomb = _speaker_string(b"\x00" * (8 << 20))  # 8 MiB of zeros in a few hundred characters
        assert len(bomb) < 4096
        start = time.monotonic()
        err = assert_openai_error(speech(c, input="hi", voice=bomb), 400, param="voice")
        assert "more than" in err["message"] and time.monotonic() - start < 5
        huge = "\u4e00" * (960_000 // 3)  # ~0.96 MB of UTF-8, all base16384 characters
        start = time.monotonic()
        assert_openai_error(speech(c, input="hi", voice=huge), 400, param="voice")
        assert time.monotonic() - start < 5
    assert_serving(server)


def test_decode_speaker_never_inflates_past_the_embedding():
    from chattts_runtime.model.speaker import SpeakerError, decode_speaker, encode_speaker

    import numpy as np

    vec = np.linspace(-1, 1, 32).astype(np.float32)
    assert np.allclose(decode_speaker(encode_speaker(vec), 32), vec, atol=1e-3)
    for raw in (b"\x00" * (64 << 20), b"\x01" * 65, b"\x01" * 63):
        with pytest.raises(SpeakerError):
            decode_speaker(_speaker_string(raw), 32)


def test_content_length_larger_than_the_limit_is_413_before_reading(server):
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000000\r\n\r\n")
    answer, seconds = raw_http(server, head, b'{"model": "chattts"}')
    assert answer.startswith(b"HTTP/1.1 413") and b'"request_too_large"' in answer
    assert seconds < 2  # answered from the header, not after reading or waiting
    head50 = head.replace(b"1000000000000", str(50 << 20).encode())
    answer, seconds = raw_http(server, head50)  # a 50 MB body announced, none sent
    assert answer.startswith(b"HTTP/1.1 413") and seconds < 2


def test_chunked_body_past_the_limit_is_413(server):
    def chunks():
        for _ in range(40):
            yield b"x" * 65536

    with server.client() as c:
        r = c.post(SPEECH, content=chunks(), headers={"content-type": "application/json"})
    assert_openai_error(r, 413, code="request_too_large")


def test_body_that_does_not_arrive_is_408(server):
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 500\r\n\r\n")
    answer, seconds = raw_http(server, head, b'{"model": "chattts", "input": "')
    assert answer.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in answer
    assert b"connection: close" in answer.lower()
    assert 1.0 < seconds < 6  # body_timeout_seconds is 1.5
    assert_serving(server)


def test_errors_never_echo_long_input(server):
    with server.client() as c:
        for body in ({"model": "m" * 1_000_000, "voice": "alloy", "input": "hi"},
                     {"model": "chattts", "voice": "v" * 2000, "input": "hi"},
                     {"model": "chattts", "voice": "alloy", "input": "hi", "response_format": "f" * 100_000},
                     {"model": "chattts", "voice": "alloy", "input": "x" * 100_000}):
            r = c.post(SPEECH, json=body)
            assert 400 <= r.status_code < 500
            assert len(r.content) < 1024, r.content[:200]


def test_every_outcome_is_counted_and_warmup_is_not(server, tmp_path, endless_checkpoint):
    fresh = launch_server(tiny_server_config(endless_checkpoint), tmp_path)
    try:
        assert counted(fresh, "ok") == 0  # the warm-up synthesis is no user request
        with fresh.client() as c:
            assert speech(c, input="one", response_format="pcm", stream=False).status_code == 200
            assert speech(c, input="two", response_format="pcm").status_code == 200
            assert speech(c, input="").status_code == 400
            assert speech(c, input="hi", model="nope").status_code == 404
            assert c.post(SPEECH, content=b"{", headers={"content-type": "application/json"}).status_code == 400
        assert counted(fresh, "ok") == 2
        assert counted(fresh, "client_error") == 3
    finally:
        stop_server(fresh)


def _wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("stream", [False, True])
def test_client_that_leaves_stops_generation_and_is_counted_aborted(start_server, endless_checkpoint, stream):
    srv = start_server({"generation": {"max_new_frames": 4000}}, checkpoint=endless_checkpoint)
    body = json.dumps({"model": "chattts", "voice": "alloy", "input": "nobody listens",
                       "response_format": "pcm", "stream": stream}).encode()
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + body)
        assert _wait_until(lambda: gauge(srv, "chattts_requests_running") == 1)
    # the engine stops at once: no 4000 frames generated for nobody
    assert _wait_until(lambda: gauge(srv, "chattts_requests_running") == 0, timeout=5)
    steps = gauge(srv, "chattts_engine_steps_total")
    time.sleep(0.5)
    assert gauge(srv, "chattts_engine_steps_total") == steps
    assert _wait_until(lambda: counted(srv, "aborted") == 1, timeout=5)
    assert counted(srv, "ok") == 0
    assert_serving(srv)


@pytest.mark.slow
def test_grace_expiry_answers_503_in_openai_shape_and_exits_non_zero(start_server, endless_checkpoint):
    srv = start_server({"server": {"shutdown_grace_seconds": 1}, "generation": {"max_new_frames": 20000}},
                       checkpoint=endless_checkpoint)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(lambda: speech(srv.client(), input="too long to finish", response_format="pcm",
                                             stream=False))
        assert _wait_until(lambda: gauge(srv, "chattts_requests_running") == 1)
        srv.proc.send_signal(signal.SIGTERM)
        r = pending.result(timeout=30)
    assert_openai_error(r, 503, code="shutdown_timeout")
    assert r.json()["error"]["type"] == "server_error"
    assert srv.proc.wait(timeout=30) != 0


def test_unknown_fields_warned_or_refused_and_declared_extensions_pass(server, start_server, endless_checkpoint):
    from chattts_runtime.service import SpeechRequest

    extensions = {"temperature": 0, "top_p": 0.5, "top_k": 5, "seed": 1, "stream": False}
    assert set(extensions) <= set(SpeechRequest.model_fields)
    with server.client() as c:
        r = speech(c, input="hi", response_format="pcm", bogus="\r\nX-Injected: 1", **extensions)
        assert r.status_code == 200 and r.headers["x-chattts-ignored-fields"] == "bogus"
        assert "x-injected" not in r.headers
        assert "x-chattts-ignored-fields" not in speech(c, input="hi", response_format="pcm", **extensions).headers
    assert "ignored unknown field(s) bogus" in server.log()
    strict = start_server({"server": {"unknown_fields": "reject"}}, checkpoint=endless_checkpoint)
    with strict.client() as c:
        err = assert_openai_error(speech(c, input="hi", bogus=1, **extensions), 400, param="bogus",
                                  code="unknown_field")
        assert "bogus" in err["message"]
        assert speech(c, input="hi", response_format="pcm", **extensions).status_code == 200
