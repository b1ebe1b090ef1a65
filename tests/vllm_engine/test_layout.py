"""Frames <-> token ids (pure; runs wherever the tier runs)."""
from __future__ import annotations

import numpy as np
import pytest

from chattts_runtime.vllm_plugin.layout import FrameDecodeError, TokenLayout

LAYOUT = TokenLayout(text_tokens=100, audio_tokens=626, num_vq=4)


def test_vocabulary_is_text_then_one_range_per_codebook():
    assert LAYOUT.vocab_size == 100 + 4 * 626
    assert LAYOUT.code_token(0, 0) == 100
    assert LAYOUT.code_token(3, 625) == LAYOUT.vocab_size - 1
    assert LAYOUT.stop_token == LAYOUT.code_token(0, 625)
    assert LAYOUT.split(LAYOUT.code_token(2, 17)) == (2, 17)


def test_a_frame_round_trips_through_token_and_carriers():
    frame = (3, 600, 0, 624)
    token = LAYOUT.code_token(0, frame[0])
    carriers = [LAYOUT.code_token(k, frame[k]) for k in (3, 1, 2)]  # any order, the token may repeat
    assert LAYOUT.decode_frame(token, [token, *carriers]) == frame


def test_missing_carrier_is_an_error():
    token = LAYOUT.code_token(0, 1)
    with pytest.raises(FrameDecodeError, match=r"codebooks \[3\]"):
        LAYOUT.decode_frame(token, [LAYOUT.code_token(1, 2), LAYOUT.code_token(2, 2)])


def test_sampled_token_must_be_codebook_zero():
    with pytest.raises(FrameDecodeError, match="carrier"):
        LAYOUT.decode_frame(LAYOUT.code_token(1, 5), [])
    with pytest.raises(FrameDecodeError, match="not an audio code"):
        LAYOUT.decode_frame(5, [])


def test_two_carriers_for_one_codebook_is_an_error():
    token = LAYOUT.code_token(0, 1)
    ids = [LAYOUT.code_token(1, 2), LAYOUT.code_token(1, 3), LAYOUT.code_token(2, 2), LAYOUT.code_token(3, 2)]
    with pytest.raises(FrameDecodeError, match="two carriers"):
        LAYOUT.decode_frame(token, ids)


def test_a_hidden_state_round_trips_through_the_logprobs_beside_the_frame():
    frame = (7, 8, 9, 10)
    hidden = [0.5, -2.0**100, 2.0, 2.0**100, -0.0, 1.0]  # any finite float32, even equal to a carrier's logit
    token = LAYOUT.code_token(0, frame[0])
    ranked = {LAYOUT.code_token(k, frame[k]): 1.0 for k in (1, 2, 3)}
    ranked.update(enumerate(hidden))
    ranked[token] = 3.0e38
    assert LAYOUT.hidden_logprobs(len(hidden)) == len(ranked)
    assert LAYOUT.decode_frame(token, ranked) == frame
    decoded = LAYOUT.decode_hidden(list(ranked), list(ranked.values()), len(hidden))
    assert decoded.dtype == np.float32 and decoded.tolist() == hidden


def test_missing_hidden_values_are_an_error_naming_the_logprobs_needed():
    with pytest.raises(FrameDecodeError, match=r"lacks 1 of 3 hidden values \(first: 1\).*7 logprobs"):
        LAYOUT.decode_hidden([0, 2, 150], [1.0, 3.0, 1.0], 3)


def test_a_hidden_state_wider_than_the_text_range_cannot_travel():
    with pytest.raises(ValueError, match="exceeds the 100 text ids"):
        LAYOUT.hidden_logprobs(101)
