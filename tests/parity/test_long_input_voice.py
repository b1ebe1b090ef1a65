"""A long input's pieces voiced from the first one, as upstream's ``Chat._infer`` does with
``split_text`` and no ``spk_smp``: the first piece generated whole, its audio decoded (Decoder path)
and sampled by the DVAE encoder (``sample_audio_speaker``), then every piece (the first again) generated
with ``spk_emb``, ``txt_smp`` = the first piece's text and the sample's codes after the prompt.

Upstream side: its own tokenizer, speaker, ``Embed``, ``GPT.generate`` (argmax processor),
``_decode_to_wavs`` and ``sample_audio_speaker``; runtime side: the speech service on the reference and
graph engines (refine-text off here: ``test_refine.py`` covers it; the sample's text is the refined one).
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from parity_helpers import upstream_greedy_processors

PIECES = ["hello world. ", "chat tts is ok"]


def upstream_piece(up, text: str, speaker: str, frames: int, txt_smp=None, spk_smp=None):
    chat, num_vq = up.chat, up.cfg.gpt.num_vq
    prompts = chat.speaker.decorate_code_prompts([text], "[speed_5]", txt_smp, speaker)
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(
        prompts, num_vq, prompt=None if spk_smp is None else chat.speaker.decode_prompt(spk_smp))
    emb = chat.embed(input_ids, text_mask)
    chat.speaker.apply(emb, speaker, input_ids, chat.tokenizer.spk_emb_ids, torch.device("cpu"))
    return next(chat.gpt.generate(
        emb, input_ids, temperature=torch.ones(num_vq), eos_token=up.cfg.gpt.num_audio_tokens - 1,
        attention_mask=attention_mask, max_new_token=frames, min_new_token=0,
        logits_processors=upstream_greedy_processors(),
        infer_text=False, return_hidden=True, stream=False, show_tqdm=False, ensure_non_empty=False))


def runtime_pieces(up, engine_kind: str, speaker: str, voice_from_first_piece: bool):
    from chattts_runtime.config import RuntimeConfig
    from chattts_runtime.engines.graph import GraphEngine
    from chattts_runtime.engines.reference import ReferenceEngine
    from chattts_runtime.metrics import RuntimeMetrics
    from chattts_runtime.service import SpeechRequest, SpeechService

    config = RuntimeConfig.model_validate({
        "engine_kind": engine_kind, "engine": {"max_model_len": 512},
        "generation": {"temperature": 0, "max_new_frames": 24, "refine_text": False},
        "text": {"voice_from_first_piece": voice_from_first_piece}})
    metrics = RuntimeMetrics()
    engine_cls = ReferenceEngine if engine_kind == "reference" else GraphEngine
    extra = {} if engine_kind == "reference" else {"max_num_seqs": 4, "pad_shapes": True}
    engine = engine_cls(up.model, max_model_len=512, observer=metrics, **extra)
    service = SpeechService(config, up.model, engine, metrics)

    async def run():
        await engine.start()
        try:
            req = SpeechRequest(model="chattts", input="".join(PIECES), voice=speaker, response_format="pcm",
                                audio_decoder="decoder", stream=False)
            synthesis = service.prepare(req)
            await service.refine(synthesis, req)
            await service.voice_from_first_piece(synthesis, req)
            requests = (synthesis.request, *synthesis.more)
            pieces, codes = [], []
            async for chunk in service.submit(synthesis):
                codes.append(chunk.codes)
                if chunk.piece_end or chunk.finished:
                    pieces.append(np.concatenate(codes))
                    codes = []
            return requests, pieces
        finally:
            await service.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def speaker(upstream):
    from chattts_runtime.model.speaker import encode_speaker

    return encode_speaker(np.random.default_rng(11).normal(0, 1, upstream.cfg.gpt.hidden_size).astype(np.float32))


@pytest.fixture(scope="module")
def theirs(upstream, speaker):
    """Upstream's steps for PIECES (24 frames each, as the runtime's config caps them)."""
    first = upstream_piece(upstream, PIECES[0], speaker, 24)
    wav = upstream.chat._decode_to_wavs([first.hiddens[0]], True)[0]
    spk_smp = upstream.chat.sample_audio_speaker(wav)
    pieces = [upstream_piece(upstream, text, speaker, 24, txt_smp=PIECES[0], spk_smp=spk_smp).ids[0].numpy()
              for text in PIECES]
    return spk_smp, pieces


@pytest.mark.parametrize("engine_kind", ["reference", "graph"])
def test_every_piece_takes_the_first_pieces_voice_as_upstream(upstream, speaker, theirs, engine_kind):
    from chattts_runtime.model.encoder import encode_sample_codes

    spk_smp, up_pieces = theirs
    requests, pieces = runtime_pieces(upstream, engine_kind, speaker, True)
    assert [r.prompt_codes is not None for r in requests] == [True, True]
    assert encode_sample_codes(requests[0].prompt_codes.T) == spk_smp
    assert len(pieces) == len(PIECES)
    for ours, up in zip(pieces, up_pieces):
        assert len(ours) > 0
        np.testing.assert_array_equal(ours, up)


def test_off_each_piece_goes_on_its_own(upstream, speaker, theirs):
    requests, pieces = runtime_pieces(upstream, "reference", speaker, False)
    assert all(r.prompt_codes is None for r in requests)
    assert not np.array_equal(pieces[1], theirs[1][1])  # the sample did condition upstream's
