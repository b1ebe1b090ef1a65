"""The official ``openai`` client against the real server: every format whole and streamed, SSE,
the model aliases, the runtime's extensions through ``extra_body``, errors parsed as OpenAI errors."""
from __future__ import annotations

import base64
import io
import json
import wave

import numpy as np
import pytest

openai = pytest.importorskip("openai")
av = pytest.importorskip("av")

from rt_helpers import launch_server, stop_server, tiny_server_config  # noqa: E402

KEY = "sk-openai-client-test"
FRAMES = 72
SAMPLES = (2 * FRAMES - 1) * 256  # what FRAMES frames decode to
FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")


@pytest.fixture(scope="module")
def server(tmp_path_factory, endless_checkpoint):
    tmp = tmp_path_factory.mktemp("openai")
    (tmp / "keys").write_text(KEY + "\n")
    srv = launch_server(tiny_server_config(
        endless_checkpoint, server={"api_keys_path": str(tmp / "keys")},
        generation={"max_new_frames": FRAMES, "stream_chunk_frames": 12}), tmp)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def decoded_samples(data: bytes, fmt: str) -> int:
    """How many 24 kHz samples the bytes hold, read back by an independent decoder."""
    if fmt == "pcm":
        return len(data) // 2
    if fmt == "wav":
        with wave.open(io.BytesIO(data)) as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24_000, 1, 2)
            return len(w.readframes(SAMPLES * 2)) // 2
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        total = sum(frame.samples for frame in container.decode(stream))
        return round(total * 24_000 / stream.rate)


def assert_whole_utterance(data: bytes, fmt: str) -> None:
    got = decoded_samples(data, fmt)
    if fmt in ("wav", "pcm", "flac"):
        assert got == SAMPLES
    else:  # lossy codecs pad to their frame size and add an encoder delay
        assert SAMPLES <= got <= SAMPLES + 4096, (fmt, got)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_whole(client, fmt):
    if fmt not in __import__("chattts_runtime.audio_io", fromlist=["x"]).available_formats():
        pytest.skip(f"this FFmpeg build cannot encode {fmt}")
    audio = client.audio.speech.create(model="chattts", voice="alloy", input="hello there",
                                       response_format=fmt, extra_body={"stream": False})
    assert_whole_utterance(audio.content, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_streamed_by_default(client, fmt):
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="nova", input="stream every format", response_format=fmt) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        chunks = [chunk for chunk in response.iter_bytes(64) if chunk]
        data = b"".join(chunks)
    assert len(chunks) >= 2
    assert_whole_utterance(data, fmt)


def test_sse_stream_format(client):
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="alloy", input="events please", response_format="pcm",
            stream_format="sse") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] == FRAMES
    assert len(b"".join(base64.b64decode(e["audio"]) for e in deltas)) == SAMPLES * 2


def test_sse_of_a_compressed_format(client):
    with client.audio.speech.with_streaming_response.create(
            model="chattts", voice="alloy", input="mp3 events", response_format="mp3",
            stream_format="sse") as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    data = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert_whole_utterance(data, "mp3")


def test_aliases_and_extensions_give_the_same_greedy_audio(client):
    bodies = [client.audio.speech.create(model=name, voice="alloy", input="same words", response_format="pcm",
                                         extra_body={"stream": False, "seed": 7}).content
              for name in ("chattts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")]
    assert all(body == bodies[0] for body in bodies) and np.frombuffer(bodies[0], "<i2").any()


def test_unknown_field_is_ignored_and_named(client):
    response = client.audio.speech.with_raw_response.create(
        model="chattts", voice="alloy", input="hi", response_format="pcm",
        extra_body={"stream": False, "not_a_field": 1, "temperature": 0})
    assert response.headers["x-chattts-ignored-fields"] == "not_a_field"


def test_errors_are_parsed_as_openai_errors(client, server):
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.speech.create(model="chattts", voice="alloy", input="")
    assert bad.value.param == "input" and bad.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.speech.create(model="chattts", voice="no-such-voice", input="hi")
    assert bad.value.param == "voice"
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.speech.create(model="gpt-9", voice="alloy", input="hi")
    assert missing.value.code == "model_not_found"
    with openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError) as denied:
            wrong.audio.speech.create(model="chattts", voice="alloy", input="hi")
    assert denied.value.code == "invalid_api_key"
