"""``engine_kind: graph`` through the speech API: same audio as the reference engine (greedy, CPU)."""
from __future__ import annotations

import numpy as np
from rt_helpers import speech


def _pcm(srv, text: str, stream: bool) -> np.ndarray:
    with srv.client() as client:
        resp = speech(client, input=text, response_format="pcm", stream=stream)
        assert resp.status_code == 200, resp.text
        return np.frombuffer(resp.content, dtype=np.int16)


def test_graph_engine_serves_the_reference_audio(start_server):
    texts = ["hello world, this is the graph engine", "short one"]
    reference = start_server()
    expected = [_pcm(reference, t, stream) for t in texts for stream in (False, True)]
    graph = start_server({"engine_kind": "graph"})
    got = [_pcm(graph, t, stream) for t in texts for stream in (False, True)]
    assert all(len(e) > 0 for e in expected)
    for e, g in zip(expected, got):
        assert np.array_equal(e, g)
    with graph.client() as client:
        assert client.get("/ready").status_code == 200
    assert "engine graph ready" in graph.log()
