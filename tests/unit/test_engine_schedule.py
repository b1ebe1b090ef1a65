"""The engines' admission policy (chattts_runtime.engines.schedule): pure, no torch."""
from __future__ import annotations

import pytest

from chattts_runtime.engines.schedule import Admission, Stage, Waiting, plan_admission, take

GRACE = 1.0


def plan(audio, text=(), *, free=8, text_room=8, now=10.0, audio_open=True):
    return plan_admission(audio, list(text), free_slots=free, text_room=text_room, now=now,
                          next_piece_grace=GRACE, audio_open=audio_open)


def test_first_audio_work_goes_before_later_pieces_that_came_earlier():
    # Three playing responses' next pieces wait (arrived 9.5-9.7), then a burst of first pieces and a
    # voice pass: with two slots free, the newcomers get them.
    audio = [Waiting(9.5, Stage.NEXT), Waiting(9.6, Stage.NEXT), Waiting(9.7, Stage.NEXT),
             Waiting(9.8, Stage.FIRST), Waiting(9.9, Stage.VOICE)]
    assert plan(audio, free=2) == Admission(audio=(3, 4))
    # More room: the later pieces follow, oldest first.
    assert plan(audio, free=4) == Admission(audio=(0, 1, 3, 4))


def test_a_later_piece_past_its_grace_is_urgent_by_its_own_arrival():
    audio = [Waiting(8.9, Stage.NEXT), Waiting(9.5, Stage.FIRST), Waiting(9.6, Stage.NEXT)]
    # 10.0 - 8.9 > 1 s: the first one is no longer deferred, and it arrived before the first piece.
    assert plan(audio, free=1) == Admission(audio=(0,))
    assert plan(audio, free=2) == Admission(audio=(0, 1))


def test_refine_jobs_are_first_audio_work_in_arrival_order_with_their_own_cap():
    audio = [Waiting(9.1, Stage.NEXT), Waiting(9.4, Stage.FIRST)]
    text = [9.2, 9.3, 9.5]
    assert plan(audio, text, free=3) == Admission(audio=(1,), text=(0, 1))
    # Refine rows full: only audio, urgent first.
    assert plan(audio, text, free=3, text_room=0) == Admission(audio=(0, 1))
    # One refine row left: the oldest refine job takes it.
    assert plan(audio, text, free=3, text_room=1) == Admission(audio=(0, 1), text=(0,))


def test_held_audio_keeps_its_place_and_refine_still_starts():
    audio = [Waiting(9.0, Stage.FIRST)]
    assert plan(audio, [9.5], free=4, audio_open=False) == Admission(text=(0,))
    assert plan(audio, [9.5], free=1) == Admission(audio=(0,))


@pytest.mark.parametrize("free", [0, -1])
def test_no_free_slot_admits_nothing(free):
    assert plan([Waiting(0.0)], [0.0], free=free) == Admission()


def test_ties_keep_queue_order():
    audio = [Waiting(9.0, Stage.FIRST), Waiting(9.0, Stage.FIRST), Waiting(9.0, Stage.FIRST)]
    assert plan(audio, free=2) == Admission(audio=(0, 1))


def test_take_splits_a_queue_in_order():
    taken, left = take(list("abcde"), (3, 1))
    assert taken == ["b", "d"]
    assert left == ["a", "c", "e"]


def test_stage_values_travel_as_strings():
    # SynthesisRequest.stage crosses the engine process's pipe (pickled) and the policy accepts either form.
    assert plan([Waiting(9.9, "next"), Waiting(9.95, "first")], free=1) == Admission(audio=(1,))


def test_a_burst_of_long_inputs_on_a_full_engine_keeps_playing_streams_within_their_grace():
    # 256 slots, all busy; then slots free up one step at a time while a burst of 300 long inputs (each a
    # voice pass, then a refine job per piece) keeps arriving ahead of the playing streams' next pieces.
    now = 100.0
    waiting_next = [Waiting(now - 0.2 + i * 1e-3, Stage.NEXT) for i in range(8)]
    burst = [Waiting(now - 0.1 + i * 1e-4, Stage.VOICE) for i in range(300)]
    refine = [now - 0.1 + i * 1e-4 for i in range(300)]
    assert plan([*waiting_next, *burst], refine, free=0, text_room=64, now=now) == Admission()
    # While the next pieces are inside their grace, the burst's first-audio work takes every free slot,
    # refine jobs (arrival order, across both kinds) up to their own cap.
    early = plan([*waiting_next, *burst], refine, free=100, text_room=64, now=now)
    assert not set(early.audio) & set(range(8))
    assert len(early.audio) + len(early.text) == 100 and len(early.text) <= 64
    # Past the grace (1 s after they arrived), the oldest next pieces go first, whatever is still waiting.
    late = plan([*waiting_next, *burst], refine, free=4, text_room=64, now=now + 0.85)
    assert late == Admission(audio=(0, 1, 2, 3))


def test_a_full_refine_cap_leaves_the_slots_to_audio():
    audio = [Waiting(9.9, Stage.FIRST), Waiting(9.95, Stage.FIRST)]
    assert plan(audio, [9.0, 9.1], free=3, text_room=0) == Admission(audio=(0, 1))
    assert plan(audio, [9.0, 9.1], free=3, text_room=1) == Admission(audio=(0, 1), text=(0,))
