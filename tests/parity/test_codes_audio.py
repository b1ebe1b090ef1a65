"""Prompt ids, greedy audio codes, GPT hidden states, mel and waveform: the runtime against upstream.

Upstream side: its own tokenizer, speaker, ``Embed``, ``GPT.generate`` (argmax processor), then
``Chat._decode_to_wavs`` (Decoder path: ``use_decoder=True``, its default; DVAE path otherwise).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from parity_helpers import run_reference, upstream_codes

TEXTS = ["hello world", "你好世界, 我们是语音合成", "chat tts: ok?"]
FRAMES = 40


@pytest.fixture(scope="module")
def both(upstream):
    from chattts_runtime.engines.base import SynthesisRequest
    from chattts_runtime.model.sampling import SamplingParams
    from chattts_runtime.model.speaker import encode_speaker

    model = upstream.model
    rng = np.random.default_rng(3)
    speaker = encode_speaker(rng.normal(0, 1, upstream.cfg.gpt.hidden_size).astype(np.float32))
    ours, theirs, prompts = [], [], []
    requests = []
    for i, text in enumerate(TEXTS):
        prompt = model.tokenizer.build(text, with_speaker=True)
        prompts.append(list(prompt.input_ids))
        requests.append(SynthesisRequest(f"p{i}", prompt.input_ids, model.speaker_for(speaker).numpy(),
                                         SamplingParams(temperature=0, max_new_frames=FRAMES), want_hidden=True))
        theirs.append(upstream_codes(upstream, text, speaker, FRAMES))
    ours = run_reference(model, requests)
    return prompts, ours, theirs


def test_prompt_ids_equal(both):
    prompts, _, theirs = both
    assert prompts == [t[0] for t in theirs]


def test_greedy_codes_and_hidden_states_equal(both):
    _, ours, theirs = both
    for (codes, hidden), (_, up_codes, up_hidden) in zip(ours, theirs):
        assert codes.shape[0] > 0
        np.testing.assert_array_equal(codes, up_codes)
        np.testing.assert_allclose(hidden, up_hidden, atol=1e-4, rtol=0)


@pytest.mark.parametrize("use_decoder", [True, False], ids=["decoder", "dvae"])
def test_mel_and_waveform_equal(upstream, both, use_decoder):
    model, chat = upstream.model, upstream.chat
    _, ours, theirs = both
    for (codes, hidden), (_, up_codes, up_hidden) in zip(ours, theirs):
        with torch.inference_mode():
            if use_decoder:
                ours_mel = model.decoder(torch.from_numpy(hidden).T[None])
                up_mel = chat.decoder(torch.from_numpy(up_hidden).T[None].contiguous())
                ours_wav = model.hidden_to_audio(torch.from_numpy(hidden)[None])
                up_wav = chat._decode_to_wavs([torch.from_numpy(up_hidden)], True)
            else:
                ours_mel = model.dvae(torch.from_numpy(codes).T[None])
                up_mel = chat.dvae(torch.from_numpy(up_codes).T[None].contiguous())
                ours_wav = model.codes_to_audio(torch.from_numpy(codes)[None])
                up_wav = chat._decode_to_wavs([torch.from_numpy(up_codes)], False)
        np.testing.assert_allclose(ours_mel.numpy(), up_mel.numpy(), atol=1e-4, rtol=0)
        assert ours_wav.shape == up_wav.shape and float(np.abs(up_wav).max()) > 1e-3
        np.testing.assert_allclose(ours_wav.numpy(), up_wav, atol=1e-5, rtol=0)
