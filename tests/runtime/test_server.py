"""The real server on loopback (subprocess, tiny random checkpoint)."""
from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import signal
import wave

import httpx
import numpy as np
import pytest

from rt_helpers import launch_server, speech

from tests.support import free_port

SAMPLES_PER_FRAME = 512


def parse_wav(data: bytes):
    with wave.open(io.BytesIO(data)) as w:
        return w.getframerate(), w.getnchannels(), w.getsampwidth(), w.readframes(w.getnframes())


def sample(metrics: dict, name: str, labels: dict | None = None) -> float:
    for s in metrics.get(name.removesuffix("_total").removesuffix("_count").removesuffix("_sum")
                         .removesuffix("_bucket"), []):
        if s.name == name and (labels is None or all(s.labels.get(k) == v for k, v in labels.items())):
            return s.value
    raise KeyError(name)


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, endless_checkpoint):
    """One shared server: endless checkpoint, 48 frames per request, greedy."""
    tmp = tmp_path_factory.mktemp("server")
    running = launch_server({
        "model": {"path": str(endless_checkpoint)}, "engine_kind": "reference", "device": "cpu",
        "server": {"host": "127.0.0.1", "port": free_port(), "max_queue": 64},
        "engine": {"max_num_seqs": 16},
        "generation": {"temperature": 0, "max_new_frames": 48, "stream_chunk_frames": 12, "refine_text": False}}, tmp)
    try:
        yield running
    finally:
        running.proc.send_signal(signal.SIGKILL)
        running.proc.wait(timeout=30)


def test_health_ready_models(server):
    with server.client() as c:
        health = c.get("/health").json()
        assert health["status"] == "ok"
        # what start-up found of upstream's data, and each one missing named (also in the log, as a warning)
        data = health["upstream_data"]
        assert data["speaker_stats"].endswith("spk_stat.safetensors")  # the tiny checkpoint's
        assert ("homophones" in data["missing"]) == (data["homophones"] is None)
        for lang, name in (("zh", "wetext"), ("en", "nemo")):
            assert (f"normalizer_{lang}" in data["missing"]) == (data["normalizers"].get(lang) != name)
        log = server.log_path.read_text()
        assert all(f"upstream data missing: {name} (" in log for name in data["missing"])
        metrics = c.get("/metrics").text
        for item in ("homophones", "speaker_stats", "normalizer_zh", "normalizer_en"):
            value = 1.0 if item in data["missing"] else 0.0
            assert f'chattts_upstream_data_missing{{item="{item}"}} {value}' in metrics
        ready = c.get("/ready")
        assert ready.status_code == 200 and ready.json()["engine"] == "reference"
        models = c.get("/v1/models").json()
        assert models["object"] == "list" and models["data"][0]["id"] == "chattts"


def test_wav_and_pcm_are_real_24khz_audio(server):
    with server.client() as c:
        wav = speech(c, input="hello world", response_format="wav")
        assert wav.status_code == 200 and wav.headers["content-type"] == "audio/wav"
        rate, channels, width, frames = parse_wav(wav.content)
        assert (rate, channels, width) == (24_000, 1, 2)
        assert len(frames) == (2 * 48 - 1) * 256 * 2  # 48 frames of 2 mel frames, 16-bit
        assert any(frames)
        pcm = speech(c, input="hello world", response_format="pcm")
        assert pcm.status_code == 200 and pcm.content == frames  # same greedy audio, raw


def test_encoded_formats_or_clear_400(server):
    from chattts_runtime.audio_io import available_formats

    with server.client() as c:
        for fmt, magic in (("flac", b"fLaC"), ("mp3", None), ("opus", b"OggS")):
            r = speech(c, input="hi", response_format=fmt)
            if fmt in available_formats():
                assert r.status_code == 200, r.text
                assert len(r.content) > 100
                if magic:
                    assert r.content.startswith(magic)
            else:
                assert r.status_code == 400 and "av" in r.json()["error"]["message"]


def test_streaming_returns_audio_in_several_chunks(server):
    body = {"model": "chattts", "voice": "nova", "input": "stream me", "response_format": "pcm", "stream": True}
    with server.client() as c, c.stream("POST", "/v1/audio/speech", json=body) as r:
        assert r.status_code == 200 and r.headers.get("transfer-encoding") == "chunked"
        chunks = [chunk for chunk in r.iter_raw() if chunk]
    assert len(b"".join(chunks)) == (2 * 48 - 1) * 256 * 2
    # 48 frames in chunks of 4 (first) then 12 frames: the body was sent in several writes
    assert len(chunks) >= 2


def test_sse_stream_format(server):
    body = {"model": "chattts", "voice": "alloy", "input": "events", "response_format": "pcm", "stream_format": "sse"}
    with server.client() as c:
        r = c.post("/v1/audio/speech", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert len(audio) == (2 * 48 - 1) * 256 * 2


def test_concurrent_requests_are_batched_and_metrics_parse(server):
    before = server.metrics()
    waits_before = sample(before, "vllm:scheduler_deadline_wait_seconds_count")
    texts = [f"concurrent request number {i}" for i in range(8)]

    def one(text):  # whole responses: one decode each, the same alone as in a batch
        with server.client() as c:
            return speech(c, input=text, response_format="pcm", stream=False)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(one, texts))
    assert all(r.status_code == 200 for r in responses)
    after = server.metrics()
    assert sample(after, "vllm:scheduler_deadline_wait_seconds_count") == waits_before + 8
    # some engine steps ran more than one sequence
    single_before = sample(before, "chattts_batch_size_bucket", {"le": "1.0"})
    single_after = sample(after, "chattts_batch_size_bucket", {"le": "1.0"})
    total_before = sample(before, "chattts_batch_size_count")
    total_after = sample(after, "chattts_batch_size_count")
    assert (total_after - total_before) > (single_after - single_before)
    assert sample(after, "chattts_audio_seconds_total") > sample(before, "chattts_audio_seconds_total")
    assert sample(after, "chattts_real_time_factor_count") >= 8
    assert sample(after, "chattts_time_to_first_audio_seconds_count") >= 8
    # The same greedy audio alone as in the batch, to float rounding: the same codes, while the
    # hidden states the Decoder path turns into audio come from a GPT step of 8 rows instead of 1,
    # whose matrix kernels may sum in another order (1e-7 apart). Converted to 16-bit PCM, such a
    # difference moves a sample by one step at most, and only where it sat on a rounding edge
    # (seen: 1-2 samples of 24,320). A different code would move thousands of samples by far more.
    with server.client() as c:
        alone = speech(c, input=texts[3], response_format="pcm", stream=False)
    ours, batched = (np.frombuffer(r.content, "<i2").astype(np.int32) for r in (alone, responses[3]))
    assert ours.shape == batched.shape
    steps = np.abs(ours - batched)
    assert steps.max() <= 1 and np.count_nonzero(steps) <= ours.size // 1000, (steps.max(), np.count_nonzero(steps))


@pytest.mark.parametrize("body,status,param", [
    ({"input": ""}, 400, "input"),
    ({"input": "x" * 4097}, 400, "input"),
    ({"input": "hi", "voice": "darth"}, 400, "voice"),
    ({"input": "hi", "response_format": "ogg-vorbis"}, 400, "response_format"),
    ({"input": "hi", "speed": 4.5}, 400, "speed"),
    ({"input": "hi", "speed": 0.1}, 400, "speed"),
    ({"input": "hi", "model": "gpt-9"}, 404, "model"),
    ({"input": 5}, 400, "input"),
    ({"voice": "alloy"}, 400, "input"),
])
def test_bad_input_gets_openai_shaped_4xx(server, body, status, param):
    payload = {"model": "chattts", "voice": "alloy", **body}
    payload = {k: v for k, v in payload.items() if k != "input" or "input" in body}
    with server.client() as c:
        r = c.post("/v1/audio/speech", json=payload)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"] and err["type"]
        assert speech(c, input="still serving", response_format="pcm").status_code == 200


def test_malformed_json_and_wrong_content_type(server):
    with server.client() as c:
        r = c.post("/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        r = c.post("/v1/audio/speech", content=b"[1, 2]", headers={"content-type": "application/json"})
        assert r.status_code == 400
        r = c.post("/v1/audio/speech", content=b"input=hi", headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        assert c.get("/v1/nothing").status_code == 404
        assert speech(c, input="still serving", response_format="pcm").status_code == 200


@pytest.mark.slow
def test_full_queue_answers_429_with_retry_after(start_server, endless_checkpoint):
    srv = start_server({"engine": {"max_num_seqs": 1}, "server": {"max_queue": 1},
                        "generation": {"max_new_frames": 400}}, checkpoint=endless_checkpoint)

    def one(i):
        with srv.client() as c:
            return speech(c, input=f"busy {i}", response_format="pcm")

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(one, range(6)))
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes and 429 in codes
    rejected = next(r for r in responses if r.status_code == 429)
    assert int(rejected.headers["retry-after"]) >= 1
    assert rejected.json()["error"]["type"] == "rate_limit_error"
    assert sample(srv.metrics(), "chattts_requests_total", {"status": "rejected"}) >= 1
    with srv.client() as c:
        assert speech(c, input="after the burst", response_format="pcm").status_code == 200


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_and_exits_0(start_server, endless_checkpoint):
    """Also: streamed audio arrives while the request is still being generated."""
    frames = 600
    srv = start_server({"generation": {"max_new_frames": frames, "stream_chunk_frames": 12}},
                       checkpoint=endless_checkpoint)
    body = {"model": "chattts", "voice": "alloy", "input": "finish me", "response_format": "pcm", "stream": True}
    with srv.client() as c, c.stream("POST", "/v1/audio/speech", json=body) as r:
        chunks = r.iter_bytes()
        first = next(chunks)
        running = sample(srv.metrics(), "chattts_requests_running")
        srv.proc.send_signal(signal.SIGTERM)
        rest = b"".join(chunks)
    assert len(first) > 0 and running == 1  # first audio out, generation still going
    assert len(first + rest) == (2 * frames - 1) * 256 * 2  # the in-flight request completed
    assert srv.proc.wait(timeout=60) == 0
    with pytest.raises(httpx.HTTPError):
        httpx.get(srv.url + "/health", timeout=2)
    assert "Shutting down" in srv.log()
