"""The connection layer (issue 35, ``chattts_runtime/connections.py``): every limit proven with real
sockets against a real server on loopback. Each of these held nothing on uvicorn's bare httptools
protocol (unbounded headers, no header or idle timeout, no send timeout, no connection cap, text/plain
framing errors, no Host or Authorization rules, HTTP/2.0 answered 200)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from rt_helpers import REPO, launch_server, speech, stop_server, tiny_server_config

LIMITS = {"max_header_bytes": 4096, "max_header_count": 20, "header_timeout_seconds": 1.0,
          "idle_timeout_seconds": 1.0, "keep_alive_timeout_seconds": 1.0, "send_timeout_seconds": 1.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, endless_checkpoint):
    srv = launch_server(tiny_server_config(
        endless_checkpoint, server=LIMITS,
        generation={"max_new_frames": 1500, "stream_chunk_frames": 24}), tmp_path_factory.mktemp("conn"))
    yield srv
    stop_server(srv)


def address(srv) -> tuple[str, int]:
    host, port = srv.url.removeprefix("http://").split(":")
    return host, int(port)


def refused(srv, reason: str) -> float:
    return sum(s.value for s in srv.metrics().get("chattts_http_refused", [])
               if s.name == "chattts_http_refused_total" and s.labels.get("reason") == reason)


def read_all(sock: socket.socket, limit: float = 10.0) -> bytes:
    """Everything until the server closes; failing when it keeps the connection ``limit`` seconds."""
    sock.settimeout(limit)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the server kept the connection open for {limit} s; got {out[:200]!r}") from None
    return out


def exchange(srv, data: bytes) -> bytes:
    with socket.create_connection(address(srv), timeout=10) as sock:
        sock.sendall(data)
        return read_all(sock)


def openai_error(answer: bytes, status: int, code: str) -> dict:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert b"content-type: application/json" in head.lower()
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code
    return err


def get(path: str = "/health", *headers: str, version: str = "1.1") -> bytes:
    return (f"GET {path} HTTP/{version}\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


def assert_serving(srv) -> None:
    with srv.client() as c:
        assert c.get("/health").status_code == 200
        assert speech(c, input="still serving", response_format="pcm", stream=False,
                      max_new_tokens=8).status_code == 200


def test_header_size_and_count_get_431(server):
    before = refused(server, "header_too_large")
    big = exchange(server, get("/health", "Host: x", "X-Big: " + "a" * 8000))  # complete, too large
    openai_error(big, 431, "header_too_large")
    many = exchange(server, get("/health", "Host: x", *(f"X-{i}: v" for i in range(30))))
    openai_error(many, 431, "header_too_large")
    # An unfinished header growing without end is cut at the limit, never parsed to its end.
    with socket.create_connection(address(server), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer = b""
        try:
            for _ in range(256):  # up to 1 MiB, 4 KiB at a time
                sock.sendall(b"a" * 4096)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_all(sock)
    openai_error(answer, 431, "header_too_large")
    assert refused(server, "header_too_large") == before + 3
    ok = exchange(server, get("/health", "Host: x", "Connection: close", "X-Fine: " + "a" * 2000))
    assert ok.startswith(b"HTTP/1.1 200")
    assert_serving(server)


def test_slow_header_gets_408_and_idle_connections_close(server):
    before = refused(server, "header_timeout"), refused(server, "idle_timeout")
    with socket.create_connection(address(server), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and nothing more
        answer = read_all(sock)
    openai_error(answer, 408, "header_timeout")
    with socket.create_connection(address(server), timeout=10) as sock:  # sends nothing at all
        assert read_all(sock) == b""  # closed by the server (not by our 10 s limit)
    assert refused(server, "header_timeout") == before[0] + 1
    assert refused(server, "idle_timeout") == before[1] + 1


def test_kept_alive_connection_closes_after_its_timeout(server):
    with socket.create_connection(address(server), timeout=10) as sock:
        sock.sendall(get("/health", "Host: x"))
        answer = read_all(sock)  # the answer, then the close once the keep-alive timeout passes
    assert answer.startswith(b"HTTP/1.1 200") and b'"ok"' in answer


def test_stalled_reader_is_aborted_and_its_stream_stops(server):
    before = refused(server, "send_timeout")
    body = json.dumps({"model": "chattts", "voice": "alloy", "input": "a long answer nobody reads",
                       "response_format": "pcm", "max_new_tokens": 1400}).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the server's sends stall
    try:
        sock.connect(address(server))
        # Pipelined: more audio than the kernel buffers on both ends hold (a few MB on loopback).
        sock.sendall(5 * (b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body))
        deadline = time.monotonic() + 120
        while refused(server, "send_timeout") == before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert refused(server, "send_timeout") == before + 1
        # Its engine work stopped with it: nothing left running, the request counted as aborted.
        while time.monotonic() < deadline and next(
                s.value for s in server.metrics()["chattts_requests_running"]) > 0:
            time.sleep(0.2)
        assert next(s.value for s in server.metrics()["chattts_requests_running"]) == 0
    finally:
        sock.close()
    log = server.log()
    assert "read nothing for 1 s" in log and "unexpected error" not in log
    assert_serving(server)


@pytest.mark.parametrize("request_bytes,status,code", [
    (get("/health", "Host: x", version="2.0"), 505, "http_version_not_supported"),
    (get("/health"), 400, "bad_host"),
    (get("/health", "Host: x", "Host: y"), 400, "bad_host"),
    (get("/v1/models", "Host: x", "Authorization: Bearer a", "Authorization: Bearer b"), 400,
     "duplicate_authorization"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400, "bad_request"),
    (b"NOT HTTP AT ALL\r\n\r\n", 400, "bad_request"),
])
def test_protocol_edges_in_openai_shape(server, request_bytes, status, code):
    openai_error(exchange(server, request_bytes), status, code)


def test_framing_errors_are_counted(server):
    before = refused(server, "bad_request")
    exchange(server, b"\x00\x01garbage\r\n\r\n")
    assert refused(server, "bad_request") == before + 1
    assert exchange(server, get("/health", "Connection: close", version="1.0")).startswith(b"HTTP/1.1 200")


def test_connection_cap_refuses_with_503_and_a_log_line(tmp_path, tiny_checkpoint):
    srv = launch_server(tiny_server_config(tiny_checkpoint, server={"max_connections": 6}), tmp_path)
    held: list[socket.socket] = []
    try:
        for _ in range(6):  # idle connections up to the cap (the idle timeout is 10 s by default)
            held.append(socket.create_connection(address(srv), timeout=10))
        time.sleep(0.5)  # let the server accept them all
        answer = exchange(srv, get("/health", "Host: x"))
        openai_error(answer, 503, "too_many_connections")
        assert b"retry-after: 1" in answer.lower()
        for sock in held:
            sock.close()
        held.clear()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the closed ones are released: served again
            if exchange(srv, get("/health", "Host: x", "Connection: close")).startswith(b"HTTP/1.1 200"):
                break
            time.sleep(0.2)
        assert refused(srv, "connection_limit") >= 1
        assert "reach server.max_connections 6" in srv.log()
    finally:
        for sock in held:
            sock.close()
        stop_server(srv)


def test_port_in_use_exits_3_before_loading(tmp_path, tiny_checkpoint):
    import yaml

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = tiny_server_config(tiny_checkpoint, server={"port": taken.getsockname()[1]})
        path = tmp_path / "runtime.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = subprocess.run([sys.executable, "-m", "chattts_runtime", "serve", "--config", str(path)],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "already in use" in proc.stderr and "loaded" not in proc.stderr


# -- the request's edges in OpenAI's shape ---------------------------------------------------------

@pytest.mark.parametrize("field,value", [("speed", True), ("stream", "yes"), ("stream", 1), ("seed", "7"),
                                         ("top_k", 2.5), ("input", 5)])
def test_wrong_types_are_400s(server, field, value):
    with server.client() as c:
        r = speech(c, **{"input": "hi", field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text[:300]


def test_stream_and_stream_format_combinations(server):
    with server.client() as c:
        whole = speech(c, input="hi", response_format="pcm", stream=False, stream_format="audio", max_new_tokens=8)
        assert whole.status_code == 200 and whole.headers.get("content-length") == str(len(whole.content))
        conflict = speech(c, input="hi", stream=False, stream_format="sse")
        assert conflict.status_code == 400 and conflict.json()["error"]["param"] == "stream_format"
        sse = speech(c, input="hi", response_format="pcm", stream_format="sse", max_new_tokens=8)
        assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")


def test_openai_newer_voices_and_dated_models(server):
    with server.client() as c:
        for voice in ("marin", "cedar"):
            assert speech(c, input="hi", voice=voice, response_format="pcm", stream=False,
                          max_new_tokens=8).status_code == 200
        for model in ("tts-1-1106", "tts-1-hd-1106", "gpt-4o-mini-tts-2025-03-20", "gpt-4o-mini-tts-2025-12-15"):
            assert speech(c, input="hi", model=model, response_format="pcm", stream=False,
                          max_new_tokens=8).status_code == 200, model
        unknown = speech(c, input="hi", voice="nobody")
        assert unknown.status_code == 400 and "marin" in unknown.json()["error"]["message"]
        assert speech(c, input="hi", model="tts-1-latest").status_code == 404
