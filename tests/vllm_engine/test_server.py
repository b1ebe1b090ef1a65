"""The speech API served through the vllm engine: real audio, the same audio as the reference
engine, streaming, and ``vllm:scheduler_deadline_wait_seconds`` under load.

Servers run as ``python -m chattts_runtime serve`` subprocesses on loopback: one on the
vllm engine (the only vLLM engine alive during this module) and one on the reference engine.
"""
from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import signal
import subprocess
import wave
from pathlib import Path

import httpx
import pytest

from tests.support import RunningServer, free_port, launch_server

REPO = Path(__file__).resolve().parents[2]
FRAMES = 48
PCM_BYTES = (2 * FRAMES - 1) * 256 * 2  # 2 mel frames per code frame, hop 256, 16-bit mono
MAX_NUM_SEQS = 4


class Server(RunningServer):
    def client(self, **kw):
        return super().client(timeout=kw.pop("timeout", 300.0), **kw)

    def metric_values(self) -> dict[str, float]:
        """Every sample as ``name[label=value...]`` -> value."""
        return {s.name + "".join(f"[{k}={v}]" for k, v in sorted(s.labels.items())): s.value
                for samples in self.metrics().values() for s in samples}


def _start(tmp: Path, checkpoint: Path, engine_kind: str, timeout: float) -> Server:
    config = {
        "model": {"path": str(checkpoint)}, "engine_kind": engine_kind, "device": "cpu",
        "server": {"host": "127.0.0.1", "port": free_port(), "max_queue": 64},
        "engine": {"max_num_seqs": MAX_NUM_SEQS, "dtype": "float32", "enforce_eager": True, "max_model_len": 1024},
        # One stated pipeline on both engines: the vllm engine's (codes -> DVAE, no refine-text).
        "generation": {"temperature": 0, "max_new_frames": FRAMES, "stream_chunk_frames": 12,
                       "audio_decoder": "dvae", "refine_text": False}}
    workdir = tmp / engine_kind
    workdir.mkdir(exist_ok=True)
    server = launch_server(config, workdir, timeout=timeout)
    return Server(server.proc, server.url, server.log_path)


@pytest.fixture(scope="module")
def servers(tmp_path_factory, endless_checkpoint):
    tmp = tmp_path_factory.mktemp("servers")
    started: list[Server] = []
    try:
        started.append(_start(tmp, endless_checkpoint, "vllm", timeout=900))  # minutes on a loaded 2-core machine
        started.append(_start(tmp, endless_checkpoint, "reference", timeout=120))
        yield {"vllm": started[0], "reference": started[1]}
    finally:
        for server in started:
            server.proc.send_signal(signal.SIGTERM)
        for server in started:
            try:
                server.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=30)


def speech(server: Server, **body) -> httpx.Response:
    payload = {"model": "chattts", "voice": "alloy", "stream": False, **body}  # whole bodies: exact audio
    with server.client() as c:
        return c.post("/v1/audio/speech", json=payload)


def test_ready_reports_the_vllm_engine(servers):
    ready = httpx.get(servers["vllm"].url + "/ready", timeout=10)
    assert ready.status_code == 200 and ready.json()["engine"] == "vllm"


@pytest.mark.parametrize("text,voice", [("hello world", "alloy"), ("你好世界", "nova"), ("a much longer sentence, "
                                                                                     "with punctuation!", "echo")])
def test_speech_is_24khz_wav_identical_to_the_reference_engine(servers, text, voice):
    got = speech(servers["vllm"], input=text, voice=voice, response_format="wav")
    assert got.status_code == 200, got.text
    assert got.headers["content-type"] == "audio/wav"
    with wave.open(io.BytesIO(got.content)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24_000, 1, 2)
        frames = w.readframes(w.getnframes())
    assert len(frames) == PCM_BYTES and any(frames)
    want = speech(servers["reference"], input=text, voice=voice, response_format="pcm")
    assert want.status_code == 200
    assert frames == want.content, "greedy audio from vLLM differs from the reference engine's"


def test_audio_streams_in_chunks(servers):
    # That frames leave the engine before the request ends is tested on the engine itself
    # (test_engine.py); here: the API streams them as separate audio events.
    body = {"model": "chattts", "voice": "nova", "input": "stream me", "response_format": "pcm",
            "stream_format": "sse"}
    with servers["vllm"].client() as c:
        r = c.post("/v1/audio/speech", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= FRAMES // 12 and events[-1]["type"] == "speech.audio.done"
    assert len(b"".join(base64.b64decode(e["audio"]) for e in deltas)) == PCM_BYTES


def test_scheduler_deadline_wait_moves_under_load(servers):
    server = servers["vllm"]
    name = "vllm:scheduler_deadline_wait_seconds"
    before = server.metric_values()
    burst = 6 * MAX_NUM_SEQS

    def one(i: int) -> int:
        return speech(server, input=f"request number {i}", response_format="pcm").status_code

    with concurrent.futures.ThreadPoolExecutor(burst) as pool:
        assert list(pool.map(one, range(burst))) == [200] * burst
    after = server.metric_values()

    observed = after[f"{name}_count"] - before[f"{name}_count"]
    assert observed == burst
    waited = after[f"{name}_sum"] - before[f"{name}_sum"]
    # Only MAX_NUM_SEQS run at once, each for FRAMES steps: later ones wait for earlier ones.
    quick = after[f"{name}_bucket[le=0.05]"] - before[f"{name}_bucket[le=0.05]"]
    assert quick < burst - MAX_NUM_SEQS, "most of the burst should have waited for a free sequence slot"
    assert waited / burst > 0.05
    # Engine steps ran batches of several sequences, reported through vLLM's stat loggers.
    batched = after["chattts_batch_size_count"] - after["chattts_batch_size_bucket[le=1.0]"]
    assert batched > 0
    assert after["chattts_batch_size_bucket[le=4.0]"] == after["chattts_batch_size_count"]  # never > max_num_seqs


def test_the_upstream_pipeline_over_http_equals_the_reference_engine(servers):
    """Refine-text on, the Decoder path, two sentences (two pieces): asked per request on both servers."""
    import urllib.parse

    import numpy as np

    body = dict(input="Hello world. The second sentence follows!", voice="echo", response_format="pcm",
                refine_text=True, refine_temperature=0, audio_decoder="decoder")
    got, want = speech(servers["vllm"], **body), speech(servers["reference"], **body)
    assert got.status_code == 200, got.text
    assert want.status_code == 200, want.text
    refined = urllib.parse.unquote(got.headers["X-ChatTTS-Refined-Text"])
    assert refined and refined == urllib.parse.unquote(want.headers["X-ChatTTS-Refined-Text"])
    have, expected = np.frombuffer(got.content, np.int16), np.frombuffer(want.content, np.int16)
    assert len(have) == len(expected) > PCM_BYTES // 2  # two pieces chained into one stream
    assert np.abs(have).max() > 0
    # Hidden states agree to float rounding (vLLM's kernels vs the reference's): a few 16-bit steps at most.
    assert np.abs(have.astype(np.int32) - expected).max() <= 4
