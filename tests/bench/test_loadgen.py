"""The runtime benchmark's multi-process load generator (bench/runtime/loadgen.py).

Pure parts (splitting clients over processes, merging their records) directly; the process
machinery against a real HTTP server on loopback that streams PCM the way the speech API
does and records what it received and in which order.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections import Counter

import pytest

from bench.runtime import loadgen

TEXTS = [f"text {i}" for i in range(7)]
CHUNK = b"\x01\x00" * 480  # 20 ms of 24 kHz 16-bit PCM
CHUNKS_PER_REQUEST = 4


# ---------------------------------------------------------------- pure parts

@pytest.mark.parametrize(("concurrency", "expected"), [(1, 1), (16, 1), (32, 1), (33, 2), (64, 2), (256, 8),
                                                       (1000, 8)])
def test_default_procs_one_per_32_clients_at_most_8(concurrency, expected):
    assert loadgen.default_client_procs(concurrency) == expected


@pytest.mark.parametrize(("concurrency", "procs"), [(1, 1), (1, 4), (5, 2), (16, 3), (256, 8), (3, 8)])
def test_split_covers_every_client_once_in_balanced_groups(concurrency, procs):
    groups = loadgen.split_clients(concurrency, procs)
    assert len(groups) == min(procs, concurrency)
    assert sorted(c for g in groups for c in g) == list(range(concurrency))
    sizes = [len(g) for g in groups]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("bad", [(0, 1), (4, 0), (-1, 2)])
def test_split_refuses_empty_levels(bad):
    with pytest.raises(ValueError):
        loadgen.split_clients(*bad)


def test_request_text_depends_on_client_and_round_only():
    one_proc = {(c, r): loadgen.request_text(TEXTS, c, r, 3) for g in loadgen.split_clients(5, 1) for c in g
                for r in range(3)}
    three_procs = {(c, r): loadgen.request_text(TEXTS, c, r, 3) for g in loadgen.split_clients(5, 3) for c in g
                   for r in range(3)}
    assert one_proc == three_procs
    assert len(set(one_proc.values())) == len(TEXTS)  # 15 requests cycle through all texts


def record(client: int, round_: int, ttfa: float, total: float, audio_s: float, began: float = 100.0) -> dict:
    return {"client": client, "round": round_, "ttfa": ttfa, "total": total, "audio_s": audio_s,
            "rtf": total / audio_s, "began": began, "ended": began + total}


def test_summarize_measures_inside_the_window_where_every_client_runs():
    released = 100.0
    fast = loadgen.ProcResult([record(0, 0, 0.1, 1.0, 2.0, began=100.0), record(0, 1, 0.3, 1.0, 2.0, began=101.0)],
                              started=100.01, finished=102.0, cpu_s=0.5, client_lib="aiohttp", loop="asyncio")
    slow = loadgen.ProcResult([record(1, 0, 0.2, 4.0, 2.0, began=100.0)],
                              started=100.05, finished=104.0, cpu_s=3.9, client_lib="aiohttp", loop="asyncio")
    row = loadgen.summarize([fast, slow], released)
    assert row["wall_s"] == pytest.approx(4.0)
    assert row["audio_s"] == pytest.approx(6.0)
    assert row["throughput_wall_audio_s_per_s"] == pytest.approx(1.5)
    # Client 0 finishes at 102: the window is [100, 102]. Client 0's 4 audio seconds lie inside it,
    # and 1.8 of the slow request's 3.8 s of delivery (from its first audio at 100.2).
    assert row["steady_window_s"] == pytest.approx(2.0)
    assert row["throughput_audio_s_per_s"] == pytest.approx((4.0 + 2.0 * 1.8 / 3.8) / 2.0)
    assert row["requests"] == 3 and row["steady_requests"] == 2 and row["client_procs"] == 2
    assert row["ttfa_p50_s"] == pytest.approx(0.2)  # of the two steady requests (0.1 and 0.3)
    assert row["release_skew_s"] == pytest.approx(0.05)
    # Busiest process: 3.9 CPU s over its own 3.95 s window; all of them: 4.4 CPU s over the 4 s level.
    assert row["loadgen_cpu_max_proc"] == pytest.approx(3.9 / 3.95)
    assert row["loadgen_cpu_cores"] == pytest.approx(4.4 / 4.0)


def test_a_staggered_start_moves_the_window_and_leaves_ramp_requests_out():
    a = loadgen.ProcResult([record(0, r, 0.1, 1.0, 1.0, began=100.0 + r) for r in range(4)],
                           started=100.0, finished=104.0, cpu_s=0.1, client_lib="aiohttp", loop="asyncio")
    b = loadgen.ProcResult([record(1, r, 0.1, 1.0, 1.0, began=100.5 + r) for r in range(4)],
                           started=100.0, finished=104.5, cpu_s=0.1, client_lib="aiohttp", loop="asyncio")
    row = loadgen.summarize([a, b], 100.0, stagger_s=0.5)
    assert row["steady_window_s"] == pytest.approx(3.5)  # [100.5, 104.0]
    # Requests wholly inside: client 0 rounds 1-3, client 1 rounds 0-2.
    assert row["steady_requests"] == 6
    # Each request delivers its 1 s of audio evenly over 0.9 s: 2 audio s per s with both running.
    assert row["throughput_audio_s_per_s"] == pytest.approx(2.0 * (1.0 / 0.9) * 0.9, rel=0.1)


def test_summarize_refuses_nothing_to_merge():
    with pytest.raises(ValueError):
        loadgen.summarize([], 0.0)


def test_unknown_client_library_is_refused():
    with pytest.raises(ValueError, match="client library"):
        loadgen.pick_client_lib("requests")


# ---------------------------------------------------------------- against a real streaming server

class SpeechServer:
    """A loopback HTTP server speaking the speech API's streaming PCM shape, logging what arrives."""

    def __init__(self, fail_on: str | None = None):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import PlainTextResponse, Response, StreamingResponse
        from starlette.routing import Route

        self.events: list[tuple[str, str]] = []  # (path, input text or "")

        async def health(_: Request) -> Response:
            self.events.append(("/health", ""))
            return PlainTextResponse("ok")

        async def speech(request: Request) -> Response:
            body = json.loads(await request.body())
            self.events.append(("/v1/audio/speech", body["input"]))
            if fail_on is not None and body["input"] == fail_on:
                return PlainTextResponse("engine exploded", status_code=500)

            async def pcm():
                for _ in range(CHUNKS_PER_REQUEST):
                    await asyncio.sleep(0.005)
                    yield CHUNK

            return StreamingResponse(pcm(), media_type="audio/pcm")

        app = Starlette(routes=[Route("/health", health), Route("/v1/audio/speech", speech, methods=["POST"])])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    http="h11", loop="asyncio"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "SpeechServer":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def installed_client_libs() -> list[str]:
    libs = []
    for lib in loadgen.CLIENT_LIBS:
        try:
            __import__(lib)
        except ImportError:
            continue
        libs.append(lib)
    return libs


@pytest.mark.parametrize("lib", installed_client_libs())
def test_level_over_processes_sends_every_request_and_counts_its_audio(lib):
    concurrency, rounds = 5, 2
    with SpeechServer() as server:
        row = loadgen.run_level(server.url, concurrency, rounds, TEXTS, procs=2, client_lib=lib)
    assert row["concurrency"] == concurrency and row["client_procs"] == 2 and row["client_lib"] == lib
    assert row["requests"] == concurrency * rounds
    audio_per_request = CHUNKS_PER_REQUEST * len(CHUNK) / 2 / loadgen.SAMPLE_RATE
    assert row["audio_s"] == pytest.approx(concurrency * rounds * audio_per_request)
    assert 0 < row["ttfa_p50_s"] <= row["ttfa_p99_s"]
    assert row["wall_s"] > 0 and row["throughput_wall_audio_s_per_s"] == pytest.approx(row["audio_s"] / row["wall_s"])
    assert 0 < row["steady_window_s"] <= row["wall_s"] and row["throughput_audio_s_per_s"] > 0
    assert 0 <= row["loadgen_cpu_max_proc"] and 0 <= row["loadgen_cpu_cores"]
    # Exactly the bodies a single process would send, whichever process ran which client.
    sent = Counter(text for path, text in server.events if path == "/v1/audio/speech")
    expected = Counter(loadgen.request_text(TEXTS, c, r, rounds) for c in range(concurrency) for r in range(rounds))
    assert sent == expected


def test_no_request_starts_before_every_process_has_warmed_up():
    with SpeechServer() as server:
        loadgen.run_level(server.url, 6, 1, TEXTS, procs=3)
    paths = [path for path, _ in server.events]
    assert paths.count("/health") == 6  # one warm connection per client
    assert max(i for i, p in enumerate(paths) if p == "/health") < min(
        i for i, p in enumerate(paths) if p == "/v1/audio/speech")


def test_an_http_error_in_one_process_fails_the_level_with_the_servers_message():
    with SpeechServer(fail_on=loadgen.request_text(TEXTS, 3, 0, 1)) as server:
        with pytest.raises(loadgen.LoadGenError, match=r"(?s)client process \d failed.*HTTP 500.*engine exploded"):
            loadgen.run_level(server.url, 4, 1, TEXTS, procs=2)


def test_an_unreachable_server_fails_the_level_during_warm_up():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(loadgen.LoadGenError, match="client process 0 failed"):
            loadgen.run_level(f"http://127.0.0.1:{port}", 2, 1, TEXTS, procs=1)


# ---------------------------------------------------------------- capacity check (python -m bench.runtime.loadgen)

@pytest.mark.parametrize(("frames", "chunk", "plan"), [(128, 24, [8, 24, 24, 24, 24, 24]), (8, 24, [8]),
                                                       (5, 24, [5]), (30, 4, [4] * 7 + [2]), (50, 24, [8, 24, 18])])
def test_chunk_plan_short_first_window_then_full_chunks(frames, chunk, plan):
    assert loadgen.chunk_plan(frames, chunk) == plan


def test_capacity_check_streams_the_planned_audio(tmp_path):
    out = tmp_path / "capacity.json"
    assert loadgen.capacity_main(["--concurrency", "4", "--rounds", "2", "--frames", "40", "--server-procs", "1",
                                  "--client-procs", "1,2", "--client-lib", "aiohttp,httpx", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["client_procs"] for r in report["rows"]] == [1, 2] * (len(report["rows"]) // 2)
    for row in report["rows"]:
        assert row["requests"] == 8
        assert row["audio_s"] == pytest.approx(8 * 40 * loadgen.FRAME_SAMPLES / loadgen.SAMPLE_RATE)
