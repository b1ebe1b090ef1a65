"""Upstream's controls through the speech API, on a real server: refine-text, its visible result,
the audio paths, sampling fields, and 400s naming the field for what cannot run."""
from __future__ import annotations

import base64
import json
from urllib.parse import unquote

import pytest

from rt_helpers import launch_server, speech

REFINED = "X-ChatTTS-Refined-Text"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A reference-engine server with the config's defaults for refine-text and the audio path."""
    import signal

    from chattts_runtime.testing import make_tiny_checkpoint
    from rt_helpers import free_port

    tmp = tmp_path_factory.mktemp("controls")
    checkpoint = make_tiny_checkpoint(tmp / "ckpt")
    running = launch_server({
        "model": {"path": str(checkpoint)}, "engine_kind": "reference", "device": "cpu",
        "server": {"host": "127.0.0.1", "port": free_port()}, "generation": {"temperature": 0, "max_new_frames": 24}},
        tmp)
    try:
        yield running
    finally:
        running.proc.send_signal(signal.SIGKILL)
        running.proc.wait(timeout=30)


def test_refine_text_runs_by_default_and_its_text_is_visible(server):
    with server.client() as client:
        on = speech(client, input="hello world", refine_temperature=0, refine_oral=2, refine_break=4)
        off = speech(client, input="hello world", refine_text=False)
        sse = speech(client, input="hello world", stream_format="sse", refine_prompt="[oral_2][break_4]",
                     refine_temperature=0)
    assert on.status_code == 200 and REFINED in on.headers and len(on.content) > 44
    refined = unquote(on.headers[REFINED])
    assert refined.isprintable() and on.headers[REFINED].isascii()
    assert off.status_code == 200 and REFINED not in off.headers
    assert sse.status_code == 200 and unquote(sse.headers[REFINED]) == refined  # greedy: the same text
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["refined_text"] == refined
    assert sum(len(base64.b64decode(e["audio"])) for e in events[:-1]) > 44


def test_both_audio_paths_and_sampling_fields_answer(server):
    with server.client() as client:
        for decoder in ("decoder", "dvae"):
            r = speech(client, input="same words", refine_text=False, audio_decoder=decoder, temperature=0.5,
                       top_p=0.9, top_k=30, repetition_penalty=1.2, seed=4, min_new_tokens=8, max_new_tokens=12)
            assert r.status_code == 200, r.text
            samples = (len(r.content) - 44) // 2
            assert 8 * 512 - 256 <= samples <= 12 * 512  # between min and max frames of 512 samples
        seeded = [speech(client, input="same words", refine_text=False, temperature=0.7, seed=9).content
                  for _ in range(2)]
    assert seeded[0] == seeded[1]


@pytest.mark.parametrize("body,param", [
    ({"refine_prompt": "[oral_2] please"}, "refine_prompt"),
    ({"refine_prompt": "[laugh_5]"}, "refine_prompt"),
    ({"refine_oral": 12}, "refine_oral"),
    ({"refine_text": False, "refine_break": 3}, "refine_text"),
    ({"refine_prompt": "[oral_1]", "refine_oral": 2}, "refine_oral"),
    ({"audio_decoder": "vocoder"}, "audio_decoder"),
    ({"max_new_tokens": 100_000}, "max_new_tokens"),
    ({"min_new_tokens": 30, "max_new_tokens": 20}, "min_new_tokens"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
])
def test_bad_controls_are_a_400_naming_the_field(server, body, param):
    with server.client() as client:
        r = speech(client, input="hello", **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def wav_base64(seconds: float, rate: int = 24_000, channels: int = 1) -> str:
    import io
    import wave

    import numpy as np

    t = np.arange(int(rate * seconds)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.repeat(pcm, channels).tobytes())
    return base64.b64encode(buf.getvalue()).decode()


def test_a_voice_from_a_reference_clip(server):
    with server.client() as client:
        voice = client.post("/v1/audio/voices", json={"audio": wav_base64(1.5)})
        assert voice.status_code == 200, voice.text
        body = voice.json()
        assert body["frames"] == 70 and body["speaker_sample"]  # 1.5 s: 141 mel frames, halved
        r = speech(client, input="hello", refine_text=False, speaker_sample=body["speaker_sample"],
                   speaker_sample_text="hi there")
        assert r.status_code == 200, r.text
        assert len(r.content) > 44
        bad = [client.post("/v1/audio/voices", json=b) for b in (
            {"audio": "not base64!"}, {"audio": wav_base64(1.5, rate=16_000)}, {"audio": wav_base64(0.3)},
            {"audio": wav_base64(1.5, channels=2)}, {"clip": "x"})]
        assert [b.status_code for b in bad] == [400] * 5 and all(b.json()["error"]["param"] == "audio" for b in bad)
        for sample in ("一二三四五六七八九十一二三四五六七", "hello"):
            r = speech(client, input="hello", speaker_sample=sample)
            assert r.status_code == 400 and r.json()["error"]["param"] == "speaker_sample", r.text
        r = speech(client, input="hello", speaker_sample_text="only text")
        assert r.status_code == 400 and r.json()["error"]["param"] == "speaker_sample_text"
