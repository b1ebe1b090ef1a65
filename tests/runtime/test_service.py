"""SpeechService in-process: both audio paths, streaming vs whole decoding, prompt limits."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from chattts_runtime.config import RuntimeConfig
from chattts_runtime.engines.reference import ReferenceEngine
from chattts_runtime.metrics import RuntimeMetrics
from chattts_runtime.service import APIError, SpeechRequest, SpeechService


def make_service(model, **generation) -> SpeechService:
    config = RuntimeConfig.model_validate({
        "engine_kind": "reference",
        "generation": {"temperature": 0, "max_new_frames": 40, "stream_chunk_frames": 6, "refine_text": False,
                       **generation},
        "engine": {"max_model_len": 256}})
    metrics = RuntimeMetrics()
    engine = ReferenceEngine(model, max_model_len=config.engine.max_model_len, observer=metrics)
    return SpeechService(config, model, engine, metrics)


async def whole_and_streamed(service: SpeechService, text: str):
    await service.engine.start()
    try:
        req = SpeechRequest(model="chattts", input=text, voice="echo", response_format="pcm")
        synthesis = service.prepare(req)
        whole = await service.synthesize(synthesis, service.submit(synthesis))
        synthesis = service.prepare(req)
        parts = [p async for p in service.stream_audio(synthesis, service.submit(synthesis))]
    finally:
        await service.close()
    return whole, parts


@pytest.mark.parametrize("path", ["dvae", "decoder"])
def test_streamed_audio_matches_whole_decoding_in_length_and_level(endless_checkpoint, path):
    from chattts_runtime.model import load_chattts

    model = load_chattts(endless_checkpoint)
    whole, parts = asyncio.run(whole_and_streamed(make_service(model, audio_decoder=path), "same words"))
    streamed = np.concatenate(parts)
    assert len(parts) >= 3
    assert len(whole) == len(streamed) == (2 * 40 - 1) * 256
    assert np.isfinite(streamed).all() and np.abs(streamed).max() > 0
    # Chunks are decoded without right context (as ChatTTS streams), so samples differ from
    # the whole-utterance decode; the signal level must not.
    rms_whole, rms_streamed = np.sqrt(np.mean(whole ** 2)), np.sqrt(np.mean(streamed ** 2))
    assert 0.5 < rms_streamed / rms_whole < 2.0


def test_prompt_longer_than_max_model_len_is_a_400(tiny_model):
    service = make_service(tiny_model)
    # words with spaces are cut there and spoken; a run with nothing to cut at is the one refusal
    assert len(service.prepare(SpeechRequest(model="chattts", input="long words " * 30, voice="alloy")).more) > 0
    with pytest.raises(APIError) as err:
        service.prepare(SpeechRequest(model="chattts", input="你好世界" * 30, voice="alloy"))
    assert err.value.status == 400 and err.value.param == "input" and err.value.code == "input_too_long"
    assert "14 text tokens at most (engine.max_model_len 256" in err.value.message


def test_a_request_that_may_run_a_language_normalizer_is_prepared_off_the_event_loop(tiny_model):
    # WeTextProcessing / nemo take 0.1-0.9 s for one piece: the server prepares such a request in a thread
    # (routes/speech.py: off_loop_if(... or service.may_spell_out(req))), however short its input.
    service = make_service(tiny_model)
    short = SpeechRequest(model="chattts", input="It costs $5.", voice="alloy")
    service.frontend.normalizer.language_normalizers.clear()  # none installed (whatever this process has)
    assert not service.may_spell_out(short)  # nothing registered: cheap, done on the loop
    service.frontend.normalizer.language_normalizers["en"] = str.lower
    assert service.may_spell_out(short)
    assert not service.may_spell_out(short.model_copy(update={"normalize": False}))


@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_every_piece_prompt_is_its_text_tokenized_with_the_speaker_tag_and_speed(tiny_model, speed):
    # The front-end's prompts are reused as the pieces' code prompts: they must be exactly what building
    # each piece's prompt anew gives (speaker tag, speed token, ids), for one piece and for several.
    service = make_service(tiny_model)
    for text in ("short words", "long words " * 30):
        synthesis = service.prepare(SpeechRequest(model="chattts", input=text, voice="alloy", speed=speed))
        requests = (synthesis.request, *synthesis.more)
        assert len(requests) == len(synthesis.texts)
        for request, said in zip(requests, synthesis.texts):
            fresh = tiny_model.tokenizer.build(said, with_speaker=True, speed=speed)
            assert request.prompt_ids == fresh.input_ids
