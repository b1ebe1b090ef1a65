"""The benchmark's merge of the graph engine's loop reports (bench.runtime.speech_api.merge_loop_reports)."""
from bench.runtime.speech_api import merge_loop_reports


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


def test_a_mean_over_nothing_is_zero():
    idle = _report(wall=1.0, busy=1.0, steps=0.0, too_wide_per_s=0.0, too_wide_rows=0.0, rows_per_step=0.0,
                   prefills=0.0, rows_per_prefill=0.0)
    merged = merge_loop_reports([idle, idle])
    assert merged["too_wide"]["urgent_rows"] == 0.0 and merged["rows_per_step"]["first"] == 0.0
