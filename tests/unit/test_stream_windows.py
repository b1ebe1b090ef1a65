"""The streamed audio's window schedule (``audio_io.StreamWindows``), pure: which frames each window
decodes, which shapes an engine must capture, and that growing chunks keep a stream ahead of its listener."""
from __future__ import annotations

import itertools

import pytest

from chattts_runtime.audio_io import StreamWindows
from chattts_runtime.config import GenerationSettings


def windows_of(schedule: StreamWindows, frames: int) -> list[tuple[int, int, int, int]]:
    """``(sent before, start, end, sent after)`` of every window of a stream of ``frames`` frames, as the
    engines cut it: each window at ``next_end`` (the last one at the stream's end)."""
    out, sent = [], 0
    while sent < frames:
        end = min(schedule.next_end(sent), frames)
        after = schedule.sent_after(end, final=end == frames)
        out.append((sent, schedule.start(sent, end), end, after))
        sent = after
    return out


def test_the_default_schedule_is_the_one_served_so_far():
    """Without max_chunk_frames: 8 frames, then 24 at a time, windows of at most 64 frames (24 + 40)."""
    schedule = StreamWindows()
    assert schedule.chunk_sizes == (24,) and schedule.regular_shapes() == [8, 32, 56, 64]
    got = windows_of(schedule, 130)
    assert [end for _, _, end, _ in got] == [8, 32, 56, 80, 104, 128, 130]
    assert [end - start for _, start, end, _ in got] == [8, 32, 56, 64, 64, 64, 64]
    assert all(end == after for _, _, end, after in got)  # no lookahead: each window's audio is sent whole
    # a window bringing two chunks at once (due in one iteration) keeps its 40 frames of context
    assert schedule.start(56, 104) == 16


def test_growing_chunks_double_up_to_the_largest_and_never_outgrow_what_was_sent():
    schedule = StreamWindows(24, 40, max_chunk_frames=96)
    assert schedule.chunk_sizes == (24, 48, 96)
    got = windows_of(schedule, 400)
    assert [end for _, _, end, _ in got] == [8, 32, 56, 104, 200, 296, 392, 400]
    assert [end - start for _, start, end, _ in got] == [8, 32, 56, 88, 136, 136, 136, 64]
    assert schedule.regular_shapes() == [8, 32, 56, 64, 88, 136]
    assert StreamWindows(24, 40, max_chunk_frames=100).chunk_sizes == (24, 48, 96, 100)


def test_a_lookahead_sends_each_windows_audio_that_many_frames_before_its_end():
    schedule = StreamWindows(24, 40, max_chunk_frames=96, lookahead_frames=4)
    got = windows_of(schedule, 300)
    assert [(end, after) for _, _, end, after in got] == [(12, 8), (36, 32), (60, 56), (108, 104), (204, 200),
                                                          (300, 300)]
    assert [end - start for _, start, end, _ in got] == [12, 36, 60, 92, 140, 140]
    assert schedule.regular_shapes() == [12, 36, 60, 68, 92, 140]
    assert schedule.window_frames == 68


CASES = [StreamWindows(chunk, context, top, ahead) for chunk, context, top, ahead in
         [(24, 40, None, 0), (24, 40, 96, 0), (24, 40, 200, 0), (6, 4, 24, 0), (4, 4, None, 0), (1, 0, 8, 0),
          (5, 3, 17, 0), (12, 40, 48, 0), (24, 40, None, 4), (24, 40, 96, 4), (6, 4, 24, 3), (1, 0, None, 2)]]


@pytest.mark.parametrize("schedule", CASES, ids=str)
def test_every_stream_is_covered_once_with_context_and_in_few_shapes(schedule):
    shapes = set(schedule.regular_shapes())
    largest = schedule.chunk_sizes[-1]
    ahead = schedule.lookahead_frames
    for frames in range(1, 420):
        got = windows_of(schedule, frames)
        assert got[0][0] == 0 and got[-1][2] == got[-1][3] == frames
        for (sent, start, end, after), following in itertools.zip_longest(got, got[1:]):
            new = after - sent
            assert following is None or following[0] == after  # contiguous: each frame's audio sent once
            assert start == 0 or sent - start >= schedule.context_frames  # history for the convolutions
            assert 0 <= start <= sent < after <= end
            assert after == end or end - after == ahead  # decoded past what it sends by the lookahead
            if sent:  # (a stream's last window also sends the frames it would have looked ahead to)
                last = ahead if following is None else 0
                assert new <= max(schedule.chunk_frames, sent) + last and new <= largest + last
            if following is not None or start > 0:  # only a short stream's last window has a shape of its own
                assert end - start in shapes, (frames, sent, start, end)
        chunks = [after - sent for sent, _, _, after in got[1:-1]]
        assert chunks == sorted(chunks)  # chunks grow, never shrink


@pytest.mark.parametrize("schedule", [StreamWindows(), StreamWindows(max_chunk_frames=96),
                                      StreamWindows(max_chunk_frames=384),
                                      StreamWindows(max_chunk_frames=96, lookahead_frames=4)], ids=str)
def test_a_stream_at_twice_real_time_never_waits_for_a_window_after_its_second(schedule):
    """A stream generated at 2x real time, played from its first window on: each window after the second
    arrives before the listener has played what came before it (the second may not, for any schedule:
    a first window of 8 frames is 0.17 s of audio)."""
    speed = 2.0
    got = windows_of(schedule, 2000)
    first_heard = got[0][2] / speed  # in frame times; frames come out at `speed` per frame played
    for (_, _, _, before), (_, _, end, _) in zip(got[1:], got[2:]):
        arrives, played_out = end / speed, first_heard + before
        assert arrives <= played_out, (before, end)


def test_the_config_builds_the_schedule_and_refuses_chunks_that_shrink():
    assert StreamWindows.of(GenerationSettings()) == StreamWindows(24, 40, lookahead_frames=4)
    assert StreamWindows.of(GenerationSettings(stream_chunk_frames=12, stream_max_chunk_frames=48,
                                               stream_lookahead_frames=2)) == \
        StreamWindows(12, 40, max_chunk_frames=48, lookahead_frames=2)
    with pytest.raises(ValueError, match="chunks grow, never shrink"):
        GenerationSettings(stream_chunk_frames=24, stream_max_chunk_frames=12)
    with pytest.raises(ValueError, match="below chunk_frames"):
        StreamWindows(24, 40, max_chunk_frames=12)
