"""The worker-side frame book follows vLLM's batch updates (no engine needed)."""
from __future__ import annotations

import numpy as np
import pytest

from chattts_runtime.engines.base import SamplingParams
from chattts_runtime.vllm_plugin.frames import FrameBook, TrackError, request_payload


def payload(key: str, **params):
    return request_payload(key=key, params=SamplingParams(**params), speaker=np.ones(4, np.float32),
                           speaker_token_id=7)


def test_rows_follow_add_move_swap_remove():
    book = FrameBook()
    a = book.add(0, payload("a"), prompt_len=5)
    b = book.add(1, payload("b"), prompt_len=6)
    assert book.rows == [a, b]
    book.move(1, 0, swap=True)
    assert book.rows == [b, a]
    book.move(1, 2, swap=False)  # one-way move leaves a hole
    assert book.rows == [b, None, a]
    book.remove(0)
    assert book.rows == [None, None, a]
    assert "b" in book.parked and "b" not in book.active


def test_a_resumed_request_gets_its_frames_back():
    book = FrameBook()
    track = book.add(0, payload("p", temperature=0), prompt_len=3)
    track.frames.append(np.array([1, 2, 3, 4]))
    book.remove(0)  # preempted
    again = book.add(2, payload("p", temperature=0), prompt_len=3)
    assert again is track and len(again.frames) == 1


def test_parked_tracks_are_bounded():
    book = FrameBook(parked_capacity=2)
    for i in range(4):
        book.add(0, payload(f"r{i}"), prompt_len=1)
        book.remove(0)
    assert list(book.parked) == ["r2", "r3"]


def test_payload_carries_sampling_and_speaker():
    book = FrameBook()
    track = book.add(0, payload("s", temperature=0.5, top_k=7, seed=3, min_new_frames=2), prompt_len=9)
    assert track.params.top_k == 7 and track.params.min_new_frames == 2 and track.generator is not None
    assert track.speaker is not None and float(track.speaker.norm()) == pytest.approx(1.0)
    assert track.speaker_token_id == 7 and track.prompt_len == 9


def test_a_request_without_payload_is_refused():
    with pytest.raises(TrackError, match="extra_args"):
        FrameBook().add(0, {}, prompt_len=1)
