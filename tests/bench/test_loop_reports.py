"""The benchmark's account of a level from the server: the graph engine's loop reports merged over the steady
window (bench.runtime.speech_api.engine_loop) and where the streams were (occupancy)."""
import json

from bench.runtime.speech_api import LOOP_MARK, engine_loop, in_window, merge_loop_reports, occupancy


def _report(wall, busy, steps, too_wide_per_s, too_wide_rows, rows_per_step, prefills, rows_per_prefill):
    return {"wall_s": wall, "busy_share": busy, "steps_per_s": steps, "substeps_too_wide_per_s": too_wide_per_s,
            "too_wide": {"urgent_rows": too_wide_rows}, "rows_per_step": {"first": rows_per_step},
            "idle_rows_per_step": 0.0, "prefills_per_s": prefills, "rows_per_prefill": rows_per_prefill,
            "audio_launches_per_s": 0.0, "rows_per_audio_launch": 0.0, "gpu_wait_share": 0.5}


def test_means_are_weighted_by_what_they_count_and_rates_by_seconds_of_work():
    quiet = _report(wall=2.0, busy=0.5, steps=100.0, too_wide_per_s=0.0, too_wide_rows=0.0, rows_per_step=10.0,
                    prefills=0.0, rows_per_prefill=0.0)
    busy = _report(wall=1.0, busy=1.0, steps=400.0, too_wide_per_s=50.0, too_wide_rows=24.0, rows_per_step=40.0,
                   prefills=10.0, rows_per_prefill=3.0)
    merged = merge_loop_reports([quiet, busy])
    # A report without too-wide steps says nothing about their rows: the mean is the busy report's.
    assert merged["too_wide"]["urgent_rows"] == 24.0
    assert merged["rows_per_prefill"] == 3.0
    # Rows per step over 200 + 400 steps; steps per second over 3 s of work; busy share over 5 s elapsed.
    assert merged["rows_per_step"]["first"] == round((200 * 10 + 400 * 40) / 600, 3)
    assert merged["steps_per_s"] == 200.0
    assert merged["busy_share"] == 0.6
    assert merged["wall_s"] == 3.0 and merged["reports"] == 2


def test_the_audio_lag_is_a_mean_over_windows_and_its_most_the_most_of_any_report():
    few = {**_report(1.0, 1.0, 100.0, 0.0, 0.0, 10.0, 0.0, 0.0), "free_slots_per_step": 8.0,
           "draining_slots_per_step": 0.0, "audio_windows_out_per_s": 10.0, "audio_lag_ms": 50.0,
           "audio_lag_max_ms": 90.0}
    many = {**_report(1.0, 1.0, 300.0, 0.0, 0.0, 10.0, 0.0, 0.0), "free_slots_per_step": 0.0,
            "draining_slots_per_step": 4.0, "audio_windows_out_per_s": 30.0, "audio_lag_ms": 10.0,
            "audio_lag_max_ms": 40.0}
    merged = merge_loop_reports([few, many])
    assert merged["audio_lag_ms"] == 20.0 and merged["audio_lag_max_ms"] == 90.0  # (10 x 50 + 30 x 10) / 40
    assert merged["free_slots_per_step"] == 2.0 and merged["draining_slots_per_step"] == 3.0  # over 100 + 300 steps


def test_a_mean_over_nothing_is_zero():
    idle = _report(wall=1.0, busy=1.0, steps=0.0, too_wide_per_s=0.0, too_wide_rows=0.0, rows_per_step=0.0,
                   prefills=0.0, rows_per_prefill=0.0)
    merged = merge_loop_reports([idle, idle])
    assert merged["too_wide"]["urgent_rows"] == 0.0 and merged["rows_per_step"]["first"] == 0.0


def _logged(tmp_path, reports):
    log = tmp_path / "server.log"
    log.write_text("".join(f"2026-12-07 10:00:00,000 INFO engine {LOOP_MARK}{json.dumps(r)}\n" for r in reports)
                   + "INFO something else\n")
    return log


def test_the_loop_account_of_a_level_is_its_steady_window_when_the_reports_say_when_they_were_taken(tmp_path):
    ramp_up = {**_report(2.0, 1.0, 100.0, 0.0, 0.0, 10.0, 0.0, 0.0), "began_at": 10.0, "ended_at": 12.0}
    steady = {**_report(2.0, 1.0, 300.0, 0.0, 0.0, 200.0, 0.0, 0.0), "began_at": 12.0, "ended_at": 14.0}
    ramp_down = {**_report(2.0, 1.0, 100.0, 0.0, 0.0, 10.0, 0.0, 0.0), "began_at": 14.0, "ended_at": 16.0}
    log = _logged(tmp_path, [ramp_up, steady, ramp_down])
    # The steady window 11.5 .. 14.5 holds the middle of the second report only (13.0; the others' are 11 and 15).
    merged, end = engine_loop(log, 0, (11.5, 14.5))
    assert merged["scope"] == "steady window" and merged["reports"] == 1
    assert merged["rows_per_step"]["first"] == 200.0 and merged["steps_per_s"] == 300.0
    assert (merged["began_at"], merged["ended_at"]) == (12.0, 14.0) and end == log.stat().st_size
    # No window, or one no report falls in: the whole level, and the span it covers.
    for window in (None, (100.0, 200.0)):
        whole, _ = engine_loop(log, 0, window)
        assert whole["scope"] == "level" and whole["reports"] == 3
        assert (whole["began_at"], whole["ended_at"]) == (10.0, 16.0)


def test_reports_of_a_revision_without_clock_readings_are_merged_over_the_level(tmp_path):
    old = [_report(1.0, 1.0, 100.0, 0.0, 0.0, 10.0, 0.0, 0.0), _report(1.0, 1.0, 300.0, 0.0, 0.0, 30.0, 0.0, 0.0)]
    merged, _ = engine_loop(_logged(tmp_path, old), 0, (0.0, 1e9))
    assert merged["scope"] == "level" and merged["reports"] == 2 and "began_at" not in merged
    assert in_window(old, (0.0, 1e9)) == []


def test_occupancy_is_averaged_over_the_steady_window_and_says_what_is_left():
    samples = [(1.0, 2.0, 0.0), (2.0, 6.0, 2.0), (3.0, 4.0, 0.0), (9.0, 0.0, 0.0)]
    steady = occupancy(samples, 10, (1.5, 3.5))
    assert steady == {"samples": 2, "scope": "steady window", "running": 5.0, "waiting": 1.0, "neither": 4.0}
    whole = occupancy(samples, 10, None)
    assert whole["scope"] == "level" and whole["samples"] == 4 and whole["running"] == 3.0
    # Two pieces of one response running: never fewer than no stream left.
    assert occupancy([(1.0, 12.0, 0.0)], 10, None)["neither"] == 0.0
    assert occupancy([], 10, (0.0, 1.0)) is None
