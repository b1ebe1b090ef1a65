"""``engine_kind: graph`` through the speech API: same audio as the reference engine (greedy, CPU)."""
from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import speech


def _pcm(srv, text: str, stream: bool) -> np.ndarray:
    with srv.client() as client:
        resp = speech(client, input=text, response_format="pcm", stream=stream)
        assert resp.status_code == 200, resp.text
        return np.frombuffer(resp.content, dtype=np.int16)


@pytest.mark.parametrize("path", ["dvae", "decoder"])
def test_graph_engine_serves_the_reference_audio(start_server, path):
    # Each engine's default audio path differs (decoder on the reference engine, dvae on the graph
    # engine): both are set, so the engines are compared on the same path.
    texts = ["hello world, this is the graph engine", "short one"]
    same_path = {"generation": {"audio_decoder": path}}
    reference = start_server(same_path)
    expected = [_pcm(reference, t, stream) for t in texts for stream in (False, True)]
    graph = start_server({"engine_kind": "graph", **same_path})
    got = [_pcm(graph, t, stream) for t in texts for stream in (False, True)]
    assert all(len(e) > 0 for e in expected)
    for e, g in zip(expected, got):
        assert e.shape == g.shape
        diff = np.abs(e.astype(np.int32) - g.astype(np.int32)).max()
        # Codes are equal (same length); the DVAE path decodes codes, so its audio is bit-equal. The
        # Decoder path decodes float hidden states, which the graph engine's padded batches compute
        # in another order: a few int16 steps of rounding, never a different utterance.
        assert diff == 0 if path == "dvae" else diff <= 8, diff
    with graph.client() as client:
        assert client.get("/ready").status_code == 200
    assert "engine graph ready" in graph.log()


DVAE = {"generation": {"audio_decoder": "dvae"}}  # the graph engine's default path, on both sides
SEPARATE = {"engine_kind": "graph", "engine": {"process": "separate"}, **DVAE}


def test_engine_in_its_own_process_serves_the_same_audio(start_server):
    """engine.process: separate moves the engine loop to a child process; nothing else changes."""
    texts = ["the engine runs in a process of its own", "short one"]
    reference = start_server(DVAE)
    expected = [_pcm(reference, t, stream) for t in texts for stream in (False, True)]
    graph = start_server(SEPARATE)
    got = [_pcm(graph, t, stream) for t in texts for stream in (False, True)]
    for e, g in zip(expected, got):
        assert len(e) > 0 and np.array_equal(e, g)
    with graph.client() as client:
        ready = client.get("/ready").json()
    assert ready["process"] == "separate" and ready["engine"] == "graph"
    assert ready["pid"] != graph.proc.pid
    # The child's scheduler readings reach the API process's metrics (the autoscaler reads them).
    waits = [s for s in graph.metrics()["vllm:scheduler_deadline_wait_seconds"] if s.name.endswith("_count")]
    assert waits and waits[0].value >= len(got) + 1  # + the warm-up


def test_a_dead_engine_process_fails_readiness_and_ends_the_server(start_server):
    import os
    import signal

    graph = start_server(SEPARATE)
    with graph.client() as client:
        pid = client.get("/ready").json()["pid"]
    os.kill(pid, signal.SIGKILL)
    # The server notices, stops being ready and exits non-zero so its pod is restarted.
    assert graph.proc.wait(timeout=60) == 1
    assert "engine process exited with code -9" in graph.log()
