"""The streamed audio's window schedule (``audio_io.StreamWindows``), pure: which frames each window
decodes, which shapes an engine must capture, and that growing chunks keep a stream ahead of its listener."""
from __future__ import annotations

import itertools

import pytest

from chattts_runtime.audio_io import StreamWindows
from chattts_runtime.config import GenerationSettings


def windows_of(schedule: StreamWindows, frames: int) -> list[tuple[int, int, int]]:
    """``(decoded before, start, end)`` of every window of a stream of ``frames`` frames, as the engines
    cut it: each window at ``next_end`` (the last one at the stream's end)."""
    out, decoded = [], 0
    while decoded < frames:
        end = min(schedule.next_end(decoded), frames)
        out.append((decoded, schedule.start(decoded, end), end))
        decoded = end
    return out


def test_the_default_schedule_is_the_one_served_so_far():
    """Without max_chunk_frames: 8 frames, then 24 at a time, windows of at most 64 frames (24 + 40)."""
    schedule = StreamWindows()
    assert schedule.chunk_sizes == (24,) and schedule.regular_shapes() == [8, 32, 56, 64]
    got = windows_of(schedule, 130)
    assert [end for _, _, end in got] == [8, 32, 56, 80, 104, 128, 130]
    assert [end - start for _, start, end in got] == [8, 32, 56, 64, 64, 64, 64]
    # a window bringing two chunks at once (due in one iteration) keeps its 40 frames of context
    assert schedule.start(56, 104) == 16


def test_growing_chunks_double_up_to_the_largest_and_never_outgrow_what_was_sent():
    schedule = StreamWindows(24, 40, max_chunk_frames=96)
    assert schedule.chunk_sizes == (24, 48, 96)
    got = windows_of(schedule, 400)
    assert [end for _, _, end in got] == [8, 32, 56, 104, 200, 296, 392, 400]
    assert [end - start for _, start, end in got] == [8, 32, 56, 88, 136, 136, 136, 64]
    assert schedule.regular_shapes() == [8, 32, 56, 64, 88, 136]
    assert StreamWindows(24, 40, max_chunk_frames=100).chunk_sizes == (24, 48, 96, 100)


CASES = [StreamWindows(chunk, context, top) for chunk, context, top in
         [(24, 40, None), (24, 40, 96), (24, 40, 200), (6, 4, 24), (4, 4, None), (1, 0, 8), (5, 3, 17), (12, 40, 48)]]


@pytest.mark.parametrize("schedule", CASES, ids=str)
def test_every_stream_is_covered_once_with_context_and_in_few_shapes(schedule):
    shapes = set(schedule.regular_shapes())
    largest = schedule.chunk_sizes[-1]
    for frames in range(1, 420):
        got = windows_of(schedule, frames)
        assert got[0][0] == 0 and got[-1][2] == frames
        for (decoded, start, end), following in itertools.zip_longest(got, got[1:]):
            new = end - decoded
            assert following is None or following[0] == end  # contiguous: each frame's audio sent once
            assert start == 0 or decoded - start >= schedule.context_frames  # history for the convolutions
            assert 0 <= start <= decoded
            if decoded:
                assert new <= max(schedule.chunk_frames, decoded) and new <= largest
            if following is not None or start > 0:  # only a short stream's last window has a shape of its own
                assert end - start in shapes, (frames, decoded, start, end)
        chunks = [end - decoded for decoded, _, end in got[1:-1]]
        assert chunks == sorted(chunks)  # chunks grow, never shrink


@pytest.mark.parametrize("schedule", [StreamWindows(), StreamWindows(max_chunk_frames=96),
                                      StreamWindows(max_chunk_frames=384)], ids=str)
def test_a_stream_at_twice_real_time_never_waits_for_a_window_after_its_second(schedule):
    """A stream generated at 2x real time, played from its first window on: each window after the second
    arrives before the listener has played what came before it (the second may not, for any schedule:
    a first window of 8 frames is 0.17 s of audio)."""
    speed = 2.0
    got = windows_of(schedule, 2000)
    first_heard = got[0][2] / speed  # in frame times; frames come out at `speed` per frame played
    for (_, _, before), (_, _, end) in zip(got[1:], got[2:]):
        arrives, played_out = end / speed, first_heard + before
        assert arrives <= played_out, (before, end)


def test_the_config_builds_the_schedule_and_refuses_chunks_that_shrink():
    assert StreamWindows.of(GenerationSettings()) == StreamWindows(24, 40)
    assert StreamWindows.of(GenerationSettings(stream_chunk_frames=12, stream_max_chunk_frames=48)) == \
        StreamWindows(12, 40, max_chunk_frames=48)
    with pytest.raises(ValueError, match="chunks grow, never shrink"):
        GenerationSettings(stream_chunk_frames=24, stream_max_chunk_frames=12)
    with pytest.raises(ValueError, match="below chunk_frames"):
        StreamWindows(24, 40, max_chunk_frames=12)
