"""A long input voiced from its first piece (``SpeechService.voice_from_first_piece``): the front-end
plans pieces that leave room for the first piece's text and audio, and the service rebuilds every
piece's prompt with them. Equality with upstream's own steps: ``tests/parity/test_long_input_voice.py``."""
from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from chattts_runtime.text.frontend import FrontEnd
from chattts_runtime.text.normalize import TextNormalizer
from chattts_runtime.text.split import FrameBudget

SENTENCE = "the quick brown fox jumps over the lazy dog. "


def frontend(model, context: int) -> FrontEnd:
    return FrontEnd(model.tokenizer, TextNormalizer(), FrameBudget(context, 4096, frames_per_text_token=1.0))


def test_pieces_leave_room_for_the_first_pieces_voice(tiny_model):
    text = (SENTENCE * 3).strip() + "\n" + (SENTENCE * 3).strip()  # two lines: upstream's two pieces
    roomy = frontend(tiny_model, 4096)
    # Plenty of room: upstream's cut, with or without the voice.
    assert [p.text for p in roomy.pieces(text, voice_from_first=True)] == [p.text for p in roomy.pieces(text)]
    # Tight: a piece would leave no room for the first one's text and frames; planned again in half
    # the context (sentences packed two and one), every piece fits beside them.
    tight = frontend(tiny_model, 340)
    plain, voiced = tight.pieces(text), tight.pieces(text, voice_from_first=True)
    first = voiced[0].prompt
    reserve = first.text_tokens + tight.budget.frames_needed(first.text_tokens)
    assert len(plain) == 2 and len(voiced) == 4
    assert not all(tight.budget.fits(len(p.prompt.input_ids) + reserve, p.prompt.text_tokens) for p in plain)
    assert all(tight.budget.fits(len(p.prompt.input_ids) + reserve, p.prompt.text_tokens) for p in voiced)
    assert " ".join(p.text for p in voiced).split() == text.split()  # every word, in order


def test_every_piece_gets_the_first_pieces_text_and_codes_and_keeps_its_speaker(tiny_model):
    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.metrics import RuntimeMetrics
    from chattts_runtime.service import SpeechRequest, SpeechService

    config = RuntimeConfig.model_validate({
        "engine_kind": "reference", "engine": {"max_model_len": 512}, "text": {"frames_per_text_token": 1.0},
        "generation": {"temperature": 0, "max_new_frames": 40, "refine_text": False}})
    metrics = RuntimeMetrics()
    service = SpeechService(config, tiny_model, ReferenceEngine(tiny_model, max_model_len=512, observer=metrics),
                            metrics)

    async def run():
        await service.engine.start()
        try:
            req = SpeechRequest(model="chattts", input=SENTENCE * 2 + "and one more", voice="echo",
                                response_format="pcm", stream=False)
            synthesis = service.prepare(req)
            before = [r.prompt_ids for r in (synthesis.request, *synthesis.more)]
            await service.voice_from_first_piece(synthesis, req)
            return synthesis, before
        finally:
            await service.close()

    synthesis, before = asyncio.run(run())
    requests = (synthesis.request, *synthesis.more)
    assert len(requests) == 3
    sample = requests[0].prompt_codes
    assert sample is not None and sample.ndim == 2 and len(sample) > 0
    spk = tiny_model.tokenizer.spk_emb_id
    for request, old in zip(requests, before):
        np.testing.assert_array_equal(request.prompt_codes, sample)
        assert request.speaker is not None and spk in request.prompt_ids  # [spk_emb], not [empty_spk]
        assert len(request.prompt_ids) > len(old)  # the first piece's text went in after the speaker
        assert request.prompt_length + request.params.max_new_frames <= service.config.engine.max_model_len
    # the first piece's own text body is inside every prompt
    body = tiny_model.tokenizer.encode(synthesis.texts[0])
    assert all(any(list(r.prompt_ids[i:i + len(body)]) == body for i in range(len(r.prompt_ids))) for r in requests)


def _pieces_of(service, synthesis):
    """The codes of each piece as ``submit`` streams them (a piece ends at ``piece_end`` or the end)."""
    async def collect():
        pieces, current = [], []
        async for chunk in service.submit(synthesis):
            assert not chunk.error, chunk.error
            if len(chunk.codes):
                current.append(np.asarray(chunk.codes))
            if chunk.piece_end or chunk.finished:
                pieces.append(np.concatenate(current) if current else np.zeros((0, 4), np.int64))
                current = []
        return pieces
    return collect()


def test_stream_mode_speaks_the_voice_pass_first_and_the_rest_as_upstream_does(tiny_model):
    """``voice_from_first_piece: stream``: the first piece is upstream's voice pass itself (greedy: the
    same frames upstream's pass draws), and every later piece is the one upstream speaks with that sample;
    only the first piece differs from upstream's output (spoken once, without the sample)."""
    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.metrics import RuntimeMetrics
    from chattts_runtime.service import SpeechRequest, SpeechService

    def service_for(mode):
        config = RuntimeConfig.model_validate({
            "engine_kind": "reference", "engine": {"max_model_len": 512},
            "text": {"frames_per_text_token": 1.0, "voice_from_first_piece": mode},
            "generation": {"temperature": 0, "max_new_frames": 40, "refine_text": False}})
        metrics = RuntimeMetrics()
        return SpeechService(config, tiny_model, ReferenceEngine(tiny_model, max_model_len=512, observer=metrics),
                             metrics)

    text = SENTENCE * 2 + "and one more"

    async def run(mode, override=None):
        service = service_for(mode)
        await service.engine.start()
        try:
            req = SpeechRequest(model="chattts", input=text, voice="echo", response_format="pcm", stream=True,
                                voice_from_first_piece=override)
            synthesis = service.prepare(req)
            await service.voice_from_first_piece(synthesis, req)  # upstream: the pass; stream: nothing yet
            voice_pass_sample = synthesis.request.prompt_codes
            return synthesis.voice_mode, voice_pass_sample, await _pieces_of(service, synthesis)
        finally:
            await service.close()

    up_mode, up_sample, upstream = asyncio.run(run(True))
    st_mode, st_before, streamed = asyncio.run(run("stream"))
    assert (up_mode, st_mode) == ("upstream", "stream")
    assert st_before is None  # nothing generated before the first audio in stream mode
    assert len(upstream) == len(streamed) == 3
    # The first piece streamed is the voice pass: its first frames are the sample upstream encoded from.
    assert len(streamed[0]) >= len(up_sample) > 0
    # Later pieces: exactly upstream's (same sample in the prompt, greedy).
    for ours, theirs in zip(streamed[1:], upstream[1:]):
        np.testing.assert_array_equal(ours, theirs)
    # The request's own field overrides the config, both ways.
    assert asyncio.run(run(True, override="stream"))[0] == "stream"
    assert asyncio.run(run("stream", override=True))[0] == "upstream"


def test_a_request_voice_mode_outside_the_three_is_refused():
    import pydantic
    import pytest

    from chattts_runtime.service import SpeechRequest

    for bad in ("yes", "upstream", 2):
        with pytest.raises(pydantic.ValidationError):
            SpeechRequest(model="chattts", input="hi", voice="echo", voice_from_first_piece=bad)
    from chattts_runtime.config import RuntimeConfig

    for bad in ("yes", "on", 1):  # YAML's loose booleans too: the config says true, false or stream
        with pytest.raises(pydantic.ValidationError):
            RuntimeConfig.model_validate({"text": {"voice_from_first_piece": bad}})


@pytest.mark.parametrize("audio_decoder", ["dvae", "decoder"])
def test_the_warm_up_runs_the_voice_pass_on_its_own_workers(tiny_model, audio_decoder):
    """The voice pass decodes a whole piece on the decode worker and encodes its audio on the refine worker,
    threads the warm-up's synthesis never uses on the graph engine: the warm-up runs both there, so the first
    long input does not pay their first GPU work."""
    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.metrics import RuntimeMetrics
    from chattts_runtime.service import VOICE_WARMUP_FRAMES, SpeechService

    config = RuntimeConfig.model_validate({
        "engine_kind": "reference", "engine": {"max_model_len": 512},
        "generation": {"max_new_frames": 8, "refine_text": False, "audio_decoder": audio_decoder}})
    metrics = RuntimeMetrics()
    service = SpeechService(config, tiny_model, ReferenceEngine(tiny_model, max_model_len=512, observer=metrics),
                            metrics)
    seen: dict[str, list[tuple[str, tuple[int, ...]]]] = {"vocos": [], "encoder": []}

    def record(name):
        return lambda module, args, out: seen[name].append((threading.current_thread().name, tuple(args[0].shape)))

    hooks = [tiny_model.vocos.register_forward_hook(record("vocos")),
             tiny_model.encoder.register_forward_hook(record("encoder"))]

    async def run():
        await service.engine.start()
        try:
            await service.warmup()
        finally:
            await service.close()

    try:
        asyncio.run(run())
    finally:
        for hook in hooks:
            hook.remove()
    # The warm-up synthesis's own chunks are decoded on the decode worker too (the reference engine makes no
    # audio); the voice pass adds one whole piece there (its mel has two columns a frame), then the encoder's
    # run on the refine worker.
    assert any(t.startswith("chattts-decode") and shape[-1] == 2 * VOICE_WARMUP_FRAMES for t, shape in seen["vocos"])
    assert [t.split("_")[0] for t, _ in seen["encoder"]] == ["chattts-refine"]
