"""Refine-text is a stage the metrics see, a client that leaves during it stops there, and a seed
drives it (issue 35). One reference-engine server with refine on, on loopback."""
from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import unquote

import pytest

from rt_helpers import launch_server, speech, stop_server, tiny_server_config

REFINED = "X-ChatTTS-Refined-Text"


@pytest.fixture(scope="module", params=["reference", "graph", "graph-separate"])
def server(request, tmp_path_factory, endless_checkpoint):
    """The reference engine refines in a worker of its own (one request at a time: a queue), the graph
    engine as rows of its own steps (batched with the audio), also from a process of its own."""
    kind, _, process = request.param.partition("-")
    srv = launch_server(tiny_server_config(
        endless_checkpoint, engine_kind=kind, engine={"max_num_seqs": 32, "process": process or "same"},
        generation={"refine_text": True, "max_new_frames": 24, "audio_decoder": "dvae"}),
        tmp_path_factory.mktemp("refineq"))
    srv.engine = kind
    yield srv
    stop_server(srv)


def sample(srv, name: str, **labels) -> float:
    return sum(s.value for samples in srv.metrics().values() for s in samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def stage_ms(response, stage: str) -> float:
    timing = dict(part.strip().split(";dur=") for part in response.headers["Server-Timing"].split(","))
    return float(timing[stage])


def test_the_wait_in_refine_text_is_in_the_scheduler_wait_and_the_waiting_gauge(server):
    """Concurrent requests with free engine slots: each response's wait in refine-text's queue (on the
    reference engine refine-text takes one request at a time: they queue there) is part of the wait the
    scheduler metric reports for it; before, it counted from the audio pass's submission only."""
    n = 6
    wait_sum = sample(server, "vllm:scheduler_deadline_wait_seconds_sum")
    wait_count = sample(server, "vllm:scheduler_deadline_wait_seconds_count")
    waiting_seen: list[float] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            waiting_seen.append(sample(server, "chattts_requests_waiting"))
            time.sleep(0.02)

    def one(i):
        with server.client() as c:
            return speech(c, input=f"queued in refine number {i}", response_format="pcm", stream=False,
                          refine_max_new_tokens=120, refine_temperature=0)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(n) as pool:
            responses = list(pool.map(one, range(n)))
    finally:
        done.set()
        watcher.join()
    assert all(r.status_code == 200 for r in responses), [r.text[:200] for r in responses]
    refine_waits = [stage_ms(r, "refine_wait") / 1e3 for r in responses]
    assert all(stage_ms(r, "refine") / 1e3 >= w for r, w in zip(responses, refine_waits))  # its queue is in it
    if server.engine == "reference":
        assert sum(1 for w in refine_waits if w > 0) >= n // 2  # they waited for the one worker
    assert sample(server, "vllm:scheduler_deadline_wait_seconds_count") == wait_count + n
    waited = sample(server, "vllm:scheduler_deadline_wait_seconds_sum") - wait_sum
    assert waited >= sum(refine_waits) - 1e-4 * n  # Server-Timing rounds to 0.1 ms
    assert max(waiting_seen) >= 1  # requests in refine-text counted as waiting while they are
    assert sample(server, "chattts_requests_waiting") == 0


def test_a_client_that_leaves_during_refine_stops_there(server):
    steps = sample(server, "chattts_engine_steps_total")
    refined = sample(server, "chattts_first_audio_stage_seconds_count", stage="refine")
    aborted = sample(server, "chattts_requests_total", status="aborted")
    body = (b'{"model": "chattts", "voice": "alloy", "input": "nobody waits for this", '
            b'"response_format": "pcm", "refine_max_new_tokens": 1500, "refine_temperature": 0}')
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.3)  # its refine has begun
    deadline = time.monotonic() + 60
    while sample(server, "chattts_requests_total", status="aborted") == aborted and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sample(server, "chattts_requests_total", status="aborted") == aborted + 1
    time.sleep(0.5)
    assert sample(server, "chattts_first_audio_stage_seconds_count", stage="refine") == refined  # cut short
    assert sample(server, "chattts_requests_running") == 0
    if server.engine == "reference":  # refine runs outside this engine: no step at all, no audio pass
        assert sample(server, "chattts_engine_steps_total") == steps


def test_same_seed_with_refine_on_gives_the_same_audio(server):
    body = dict(input="the same words with the same seed", response_format="pcm", stream=False,
                temperature=0.5, refine_temperature=0.7, max_new_tokens=24, refine_max_new_tokens=24)
    with server.client() as c:
        first, second = (speech(c, seed=7, **body) for _ in range(2))
        other = speech(c, seed=8, **body)
    for r in (first, second, other):
        assert r.status_code == 200, r.text[:300]
    assert unquote(first.headers[REFINED]) == unquote(second.headers[REFINED])
    assert first.content == second.content
    # The seed is what fixes it: another one refines (and so speaks) otherwise.
    assert (unquote(other.headers[REFINED]), other.content) != (unquote(first.headers[REFINED]), first.content)
