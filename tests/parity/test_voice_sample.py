"""A voice from a reference clip: the runtime's DVAE encoder and sample string against upstream's
``DVAE.sample_audio`` (with ``vector_quantize_pytorch`` 1.14.24) and ``Speaker.encode_prompt``."""
from __future__ import annotations

import numpy as np
import torch


def clip(seconds: float = 1.5, seed: int = 0) -> torch.Tensor:
    t = np.arange(int(24_000 * seconds)) / 24_000
    rng = np.random.default_rng(seed)
    wav = sum(0.2 * np.sin(2 * np.pi * f * t + rng.uniform(0, 6)) for f in (110, 220, 440, 1250, 3100))
    return torch.from_numpy((wav + 0.02 * rng.normal(size=t.size)).astype(np.float32))


def test_reference_clip_codes_and_sample_string_equal(upstream):
    from chattts_runtime.model.encoder import decode_sample_codes, encode_sample_codes

    model, chat = upstream.model, upstream.chat
    assert model.encoder is not None
    for seed in range(3):
        wav = clip(1.0 + 0.5 * seed, seed)
        theirs = chat.dvae.sample_audio(wav.clone())
        ours = model.encoder(wav.clone())
        assert ours.shape == theirs.shape and ours.shape[1] > 10
        assert len(np.unique(theirs.numpy())) > 4  # not a degenerate grid
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        text = encode_sample_codes(ours.numpy())
        assert text == chat.speaker.encode_prompt(theirs)
        np.testing.assert_array_equal(decode_sample_codes(text, 4, 626, 10_000),
                                      chat.speaker.decode_prompt(text).numpy())


def test_greedy_codes_with_a_voice_sample_equal(upstream):
    """Upstream's ``_infer_code`` with ``spk_smp``/``txt_smp`` and no ``spk_emb``: the clip's codes follow the prompt."""
    from parity_helpers import run_reference, upstream_greedy_processors

    from chattts_runtime.engines.base import SynthesisRequest
    from chattts_runtime.model.encoder import decode_sample_codes, encode_sample_codes
    from chattts_runtime.model.sampling import SamplingParams

    model, chat = upstream.model, upstream.chat
    num_vq = upstream.cfg.gpt.num_vq
    sample = encode_sample_codes(model.encoder(clip(1.0, 5)).numpy())
    transcript, text, frames = "hi there", "hello world", 30
    prompts = chat.speaker.decorate_code_prompts([text], "[speed_5]", transcript, None)
    input_ids, attention_mask, text_mask = chat.tokenizer.encode(prompts, num_vq,
                                                                 prompt=chat.speaker.decode_prompt(sample))
    emb = chat.embed(input_ids, text_mask)
    result = next(chat.gpt.generate(
        emb, input_ids, temperature=torch.ones(num_vq), eos_token=625, attention_mask=attention_mask,
        max_new_token=frames, min_new_token=0, logits_processors=upstream_greedy_processors(), infer_text=False,
        return_hidden=False, stream=False, show_tqdm=False, ensure_non_empty=False))
    codes = decode_sample_codes(sample, num_vq, 625, 2000)
    prompt = model.tokenizer.build(text, with_speaker=False, sample_text=transcript)
    assert list(prompt.input_ids) == input_ids[0, :len(prompt.input_ids), 0].tolist()
    [(ours, _)] = run_reference(model, [SynthesisRequest("s", prompt.input_ids, None, SamplingParams(
        temperature=0, max_new_frames=frames), prompt_codes=codes.T.copy())])
    assert len(ours) > 0
    np.testing.assert_array_equal(ours, result.ids[0].numpy())
