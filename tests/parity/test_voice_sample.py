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
