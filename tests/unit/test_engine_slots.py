"""The graph engine's slot bookkeeping (chattts_runtime.engines.slots): pure, no torch."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from chattts_runtime.engines.schedule import Admission, Stage, Waiting, plan_admission
from chattts_runtime.engines.slots import (
    STAGE_NAMES,
    LoopStats,
    SubstepPace,
    substep_batch,
    text_width,
    text_widths_for,
    FrameBook, RefineBook, SlotTable, TextJob, WindowHold, bucket_sizes, gather_open, pick_bucket)

BATCH = bucket_sizes(8)  # [1, 2, 4, 8]
LENGTH = bucket_sizes(64, smallest=16)  # [16, 32, 64]
EOS = 9


@dataclass
class Params:  # what RefineBook reads of SamplingParams
    max_new_frames: int = 100


def step(table: SlotTable, text_rows: int = 4):
    return table.next_step(BATCH, LENGTH, 64, text_rows)


def test_the_scheduling_modules_import_without_torch():
    code = ("import sys; import chattts_runtime.engines.slots, chattts_runtime.engines.schedule; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_slots_go_lowest_first_so_a_step_covers_the_smallest_bucket():
    table = SlotTable(8)
    slots = np.array([table.claim() for _ in range(3)])
    assert slots.tolist() == [0, 1, 2]
    table.occupy(slots, [5, 20, 7], text=False)
    plan = step(table)
    assert (plan.batch, plan.length, plan.mixed) == (4, 32, False)  # slots [0, 3) -> 4 rows; 20 + 1 -> 32
    assert plan.slots.tolist() == [0, 1, 2] and plan.audio.tolist() == [0, 1, 2] and not len(plan.text)
    # Slot 0 ends: the next newcomer takes it back (not slot 3), and the bucket stays at 4 rows.
    table.release(0)
    assert table.claim() == 0


def test_a_burst_of_long_inputs_fills_the_engine_and_steps_at_the_full_bucket():
    table = SlotTable(8)
    slots = np.array([table.claim() for _ in range(8)])
    table.occupy(slots, [60] * 8, text=False)
    assert table.free == 0
    with pytest.raises(RuntimeError):
        table.claim()
    plan = step(table)
    assert (plan.batch, plan.length) == (8, 64)
    # Positions are clamped to the cache: a stream past max_len still fits the last bucket.
    for _ in range(10):
        table.stepped(plan.slots)
    assert step(table).length == 64


def test_refine_rows_ride_in_a_mixed_step_and_their_index_is_rewritten_only_when_they_change():
    table = SlotTable(8)
    audio = np.array([table.claim(), table.claim()])
    table.occupy(audio, [10, 10], text=False)
    text = np.array([table.claim()])
    table.occupy(text, [3], text=True)
    plan = step(table, text_rows=4)
    assert plan.mixed and plan.text.tolist() == [2] and plan.audio.tolist() == [0, 1]
    assert plan.text_index.tolist() == [2, 8, 8, 8]  # padded with the scratch slot
    assert step(table).text_index is None  # unchanged: the device index still holds
    table.release(0)  # an audio stream ending leaves the text index alone
    assert step(table).text_index is None
    table.release(2)  # the refine job ends
    plan = step(table)
    assert not plan.mixed and plan.text_index is None and plan.audio.tolist() == [1]


def test_an_aborted_slot_reused_before_its_launch_is_read_makes_that_launch_stale():
    table = SlotTable(4)
    slot = np.array([table.claim()])
    launched = table.occupy(slot, [4], text=False)
    assert table.live(slot, launched, text=False).all()
    table.release(int(slot[0]))  # aborted while its step was in flight
    assert not table.live(slot, launched, text=False).any()
    # A first-piece voice pass takes the slot at once: the old launch's row is still not its.
    again = np.array([table.claim()])
    assert again.tolist() == slot.tolist()
    now = table.occupy(again, [6], text=False)
    assert not table.live(again, launched, text=False).any() and table.live(again, now, text=False).all()
    # ... nor is it a refine row's.
    assert not table.live(again, now, text=True).any()


def test_a_slot_whose_audio_is_still_decoding_drains_before_anyone_takes_it():
    table = SlotTable(2)
    ended, other = table.claim(), table.claim()
    table.occupy(np.array([ended, other]), [3, 3], text=False)
    table.release(ended, drain=True)  # its last audio window is in flight on the audio stream
    assert table.free == 0 and table.draining[ended] and table.busy
    assert not table.audio[ended]  # no step reads it as a stream any more
    with pytest.raises(RuntimeError, match="no free slot"):
        table.claim()
    table.release(other)  # an abort: nothing reads it, free at once
    assert table.claim() == other
    table.drained(ended)
    assert table.free == 1 and not table.draining[ended] and table.claim() == ended
    with pytest.raises(ValueError, match="not draining"):
        table.drained(ended)
    table.release(ended, drain=True)
    table.reset()  # a failed step ends everything, draining slots too
    assert table.free == 2 and not table.draining.any()


def test_reset_frees_every_slot():
    table = SlotTable(3)
    slots = np.array([table.claim() for _ in range(3)])
    table.occupy(slots[:2], [1, 1], text=False)
    table.occupy(slots[2:], [1], text=True)
    table.reset()
    assert table.free == 3 and not table.busy
    assert sorted(table.claim() for _ in range(3)) == [0, 1, 2]


@pytest.mark.parametrize("waiting, oldest, streaming, expected", [
    (0, None, False, False),  # nothing waits
    (1, 9.99, False, True),  # an idle engine starts at once
    (1, 9.99, True, False),  # gathered while others stream...
    (1, 9.95, True, True),  # ... until the oldest waited admit_interval
    (4, 9.999, True, True),  # a whole prefill is ready
])
def test_gather_open(waiting, oldest, streaming, expected):
    assert gather_open(waiting, oldest, streaming=streaming, prefill_rows=4, admit_interval=0.05,
                       now=10.0) is expected


def test_frames_end_at_the_end_code_or_the_limit_and_chunks_fall_due():
    book = FrameBook(4, max_len=16, num_vq=2)
    book.start(0, limit=3, next_emit=2, want_hidden=False, hidden_audio=False)
    book.start(1, limit=10, next_emit=1, want_hidden=False, hidden_audio=False)
    slots = np.array([0, 1])
    first = book.accept(slots, np.array([[1, 2], [3, 4]]), EOS)
    assert first.kept.tolist() == [True, True] and first.due.tolist() == [False, True]
    assert not first.ended.any() and not first.full.any()
    second = book.accept(slots, np.array([[5, 6], [7, EOS]]), EOS)  # slot 1 draws the end code in one head
    assert second.ended.tolist() == [False, True] and second.due.tolist() == [True, False]
    assert book.count[:2].tolist() == [2, 1]  # the end frame is not kept
    third = book.accept(np.array([0]), np.array([[8, 8]]), EOS)
    assert third.full.tolist() == [True] and not third.due.any()  # full wins over due
    assert book.frames[0, :3].tolist() == [[1, 2], [5, 6], [8, 8]]


def test_refine_jobs_end_at_their_end_token_or_their_limit():
    book = RefineBook()
    a = TextJob("a", (1, 2, 3), Params(max_new_frames=2), seed=0, arrival=9.0)
    b = TextJob("b", (1,) * 60, Params(max_new_frames=100), seed=0, arrival=9.5)  # max_len bounds it
    c = TextJob("c", (1,), Params(), seed=0, arrival=9.9)
    for job, slot in ((a, 0), (b, 1), (c, 2)):
        book.start(job, slot, max_len=64, now=10.0)
    assert (a.limit, b.limit, c.scheduled_after) == (2, 4, pytest.approx(0.1))
    slots = np.array([0, 1, 2])
    assert book.accept(slots, np.array([5, 6, EOS]), EOS) == [c]
    book.finish(c)
    assert book.accept(np.array([0, 1]), np.array([7, 8]), EOS) == [a]
    assert a.tokens == [5, 7] and b.tokens == [6, 8] and c.tokens == []
    book.finish(a)
    assert list(book.running) == [1]


def test_buckets():
    assert bucket_sizes(256, step=32) == [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256]
    assert pick_bucket([1, 2, 4], 3) == 4
    with pytest.raises(ValueError):
        pick_bucket([1, 2, 4], 5)


def test_a_full_engine_admits_nothing_until_an_abort_frees_a_slot_then_first_audio_takes_it():
    # As the graph engine's worker does: the free slots are the admission policy's budget.
    table = SlotTable(4)
    running = np.array([table.claim() for _ in range(4)])
    launched = table.occupy(running, [30] * 4, text=False)
    waiting = [Waiting(9.8, Stage.NEXT), Waiting(9.9, Stage.FIRST), Waiting(9.95, Stage.VOICE)]

    def admit():
        return plan_admission(waiting, [9.85], free_slots=table.free, text_room=2, now=10.0, next_piece_grace=1.0)

    assert admit() == Admission()
    table.release(2)  # a client went away
    assert not table.live(running, launched, text=False)[2]  # its in-flight row is dropped when read
    assert admit() == Admission(text=(0,))  # the oldest first-audio work: the refine job (9.85)
    table.release(0)
    assert admit() == Admission(audio=(1,), text=(0,))  # then the first piece ...
    table.release(1)
    # ... and the voice pass, both ahead of the playing stream's next piece (inside its grace).
    assert admit() == Admission(audio=(1, 2), text=(0,))
    assert [table.claim() for _ in range(3)] == [0, 1, 2] and table.free == 0  # the freed slots, lowest first


def test_loop_stats_account_rows_by_stage_idle_rows_and_the_gpu_wait_then_start_over():
    now = [100.0]
    stats = LoopStats(clock=lambda: now[0])
    rows = dict.fromkeys(STAGE_NAMES, 0)
    rows.update(first=3, voice=2, refine=1)
    stats.step(8, np.array([rows[name] for name in STAGE_NAMES]), kv_positions=600, length=128,  # 6 of a bucket of 8
               free=4, draining=2)
    rows.update(first=0, next=4)
    stats.step(8, np.array([rows[name] for name in STAGE_NAMES]), kv_positions=1400, length=256,  # 7 of 8
               free=0, draining=5)
    stats.step(2, np.array([0, 2, 0, 0]), substep=True, kv_positions=100, length=64)  # a substep over two voice passes
    stats.substep_too_wide(40, 64, 64)  # 40 first-audio rows would take a 64-row substep after a 64-row step
    stats.prefill(3)
    stats.prefill(1)
    stats.audio(5)
    for lag in (0.010, 0.030, 0.020):  # three windows' audio out, 10 to 30 ms after they were due
        stats.audio_out(lag)
    stats.waited(0.5)
    stats.slept(1.0)  # asleep with nothing to do: not work
    now[0] += 3.0
    report = stats.report()
    assert (report["wall_s"], report["busy_share"]) == (2.0, 0.667)
    assert (report["began_at"], report["ended_at"]) == (100.0, 103.0)  # where it lies on the clock
    assert (report["steps_per_s"], report["substeps_per_s"], report["substeps_too_wide_per_s"]) == (1.5, 0.5, 0.5)
    assert report["too_wide"] == {"urgent_rows": 40.0, "substep_batch": 64.0, "full_batch": 64.0}
    assert report["rows_per_step"] == {"first": 1.0, "voice": 2.0, "next": 1.3, "refine": 0.7}
    assert report["idle_rows_per_step"] == 1.0
    assert (report["kv_positions_per_step"], report["length_bucket_per_step"]) == (700.0, 149.3)
    assert (report["prefills_per_s"], report["rows_per_prefill"]) == (1.0, 2.0)
    assert (report["audio_launches_per_s"], report["rows_per_audio_launch"]) == (0.5, 5.0)
    # Slots beside the three steps (the substep said none), and the windows' lag: mean and most.
    assert (report["free_slots_per_step"], report["draining_slots_per_step"]) == (1.3, 2.3)
    assert (report["audio_windows_out_per_s"], report["audio_lag_ms"], report["audio_lag_max_ms"]) == (1.5, 20.0, 30.0)
    assert report["gpu_wait_share"] == 0.25
    now[0] += 1.0
    fresh = stats.report()
    assert fresh["steps_per_s"] == 0.0 and stats.steps == 0  # the next report counts afresh
    assert fresh["audio_lag_max_ms"] == 0.0 and fresh["draining_slots_per_step"] == 0.0
    assert (fresh["began_at"], fresh["ended_at"]) == (103.0, 104.0)
    assert fresh["too_wide"] == dict.fromkeys(("urgent_rows", "substep_batch", "full_batch"), 0.0)


def test_the_text_head_takes_the_narrowest_captured_width_that_holds_the_refine_rows():
    widths = bucket_sizes(64, smallest=8)  # [8, 16, 32, 64]
    assert text_widths_for(widths, 4) == [4] and text_widths_for(widths, 16) == [8, 16]
    assert text_widths_for(widths, 256) == [8, 16, 32, 64]
    assert [text_width(widths, rows, 256) for rows in (1, 8, 9, 33, 64)] == [8, 8, 16, 64, 64]
    assert text_width(widths, 3, 4) == 4  # never wider than the step's batch
    with pytest.raises(ValueError):
        text_width(widths, 65, 256)  # more refine rows than refine_rows: the engine never admits them
    table = SlotTable(8)
    audio = np.array([table.claim(), table.claim()])
    table.occupy(audio, [10, 10], text=False)
    text = np.array([table.claim()])
    table.occupy(text, [3], text=True)
    assert table.next_step(BATCH, LENGTH, 64, 4, [2, 4]).text_width == 2  # 1 refine row in a batch of 4
    table.release(2)
    assert table.next_step(BATCH, LENGTH, 64, 4, [2, 4]).text_width == 0  # no refine rows: not mixed


def test_newcomers_take_the_lowest_free_slot():
    table = SlotTable(8)
    assert [table.claim() for _ in range(4)] == [0, 1, 2, 3]
    table.release(1)
    assert table.claim() == 1 and table.claim() == 4


def test_a_substep_gathers_its_slots_wherever_they_sit_and_must_hold_every_refine_row():
    table = SlotTable(8)
    table.occupy(np.array([0, 1]), [10, 3], text=False)
    table.occupy(np.array([5]), [5], text=True)
    table.occupy(np.array([6]), [40], text=False)
    full = step(table)
    assert full.batch == 8 and full.length == 64 and full.gather is None
    sub = table.next_step(BATCH, LENGTH, 64, 4, only=np.array([6, 5, 1]))
    assert sub.slots.tolist() == [1, 5, 6] and sub.batch == 4 and sub.length == 64
    assert sub.gather.tolist() == [1, 5, 6, 8]  # padded with the scratch slot
    assert sub.text.tolist() == [5] and sub.audio.tolist() == [1, 6]
    assert sub.text_index is None  # the full step already wrote the index
    narrow = table.next_step(BATCH, LENGTH, 64, 4, only=np.array([1, 5]))
    assert narrow.batch == 2 and narrow.length == 16 and narrow.gather.tolist() == [1, 5]
    with pytest.raises(ValueError, match="every refine row"):
        table.next_step(BATCH, LENGTH, 64, 4, only=np.array([0, 1]))
    with pytest.raises(ValueError, match="occupied"):
        table.next_step(BATCH, LENGTH, 64, 4, only=np.array([2, 5]))  # slot 2 is free
    with pytest.raises(ValueError, match="occupied"):
        table.next_step(BATCH, LENGTH, 64, 4, only=np.array([], np.int64))


def test_substep_batch():
    assert substep_batch(0, BATCH, 8) is None  # nothing to step
    assert substep_batch(3, BATCH, 8) == 4
    assert substep_batch(3, BATCH, 4) is None  # as wide as the full step: no gain
    assert substep_batch(5, BATCH, 8) is None  # a bucket of 8 after a step of 8
    assert substep_batch(5, [1, 2, 4], 64) is None  # past the largest substep bucket
    assert substep_batch(5, [], 64) is None  # substeps off


def test_substeps_follow_the_pace_of_full_steps():
    pace = SubstepPace(3, playing_realtime=2.0, frames_per_second=50.0)  # full steps at most 10 ms apart
    assert pace.budget == pytest.approx(0.01)
    counts = [pace.full_step(t * 0.004, urgent=True) for t in range(5)]  # 4 ms apart: room for more
    assert counts == [0, 1, 2, 3, 3]
    counts = [pace.full_step(0.016 + t * 0.02, urgent=True) for t in range(1, 12)]  # 20 ms apart: fewer
    assert counts[-1] == 0 and counts == sorted(counts, reverse=True)
    assert pace.full_step(1.0, urgent=False) == 0
    before = pace.interval
    pace.idle()
    pace.full_step(100.0, urgent=True)
    assert pace.interval == before  # the idle gap is not a step's pace
    never = SubstepPace(0, 3.0, 50.0)
    assert [never.full_step(t * 0.001, urgent=True) for t in range(5)] == [0] * 5
    with pytest.raises(ValueError):
        SubstepPace(2, 0.0, 50.0)


def test_held_windows_go_out_full_late_with_a_launch_of_their_shape_or_when_idle():
    hold = WindowHold(rows=3, hold=0.03, min_lead=0.3)
    # Only a playing stream's middle windows wait, and only while its listener is far enough ahead.
    assert hold.holdable(lead=0.5, first=False, final=False)
    assert not hold.holdable(lead=0.5, first=True, final=False)
    assert not hold.holdable(lead=0.5, first=False, final=True)
    assert not hold.holdable(lead=0.29, first=False, final=False)
    assert not WindowHold(rows=1, hold=0.03, min_lead=0.3).holdable(lead=9, first=False, final=False)
    assert not WindowHold(rows=8, hold=0.0, min_lead=0.3).holdable(lead=9, first=False, final=False)

    hold.add(64, "a", now=1.000)
    hold.add(64, "b", now=1.010)
    hold.add(32, "c", now=1.020)
    assert len(hold) == 3 and hold.due(1.020) == []
    assert hold.due(1.020, launching={32}) == [32]  # a launch of that shape goes anyway: it rides along
    assert hold.due(1.031) == [64]  # the oldest waited 30 ms
    assert hold.due(1.020, idle=True) == [64, 32]
    hold.add(64, "d", now=1.021)
    assert hold.due(1.021) == [64]  # three of a shape: a full launch
    assert hold.take(64) == ["a", "b", "d"] and hold.take(64) == []
    assert hold.keys_holding(lambda w: w == "c") == [32] and hold.keys_holding(lambda w: w == "a") == []
    assert hold.drop(lambda w: w == "c") == ["c"] and len(hold) == 0 and hold.due(9.0, idle=True) == []
    hold.add(8, "e", now=2.0)
    assert hold.clear() == ["e"] and len(hold) == 0
    with pytest.raises(ValueError):
        WindowHold(rows=0, hold=0.03, min_lead=0.3)
