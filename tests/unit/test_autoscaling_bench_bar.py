"""The autoscaler benchmark's calibrations, its new load shapes and scrape outages, its clairvoyant
bound and the bar checker."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bench.autoscaler import simulate as bench
from bench.autoscaler import traces
from bench.autoscaler.fleet import FleetModel, simulate
from bench.autoscaler.bar import bar_section, verdict, verdicts
from bench.autoscaler.policies import ClairvoyantAtArrival

RESULTS = Path(bench.__file__).resolve().parents[1] / "results"


@pytest.fixture
def results_with_a_decoy(tmp_path: Path) -> Path:
    """The three calibration files, plus a newer-looking runtime file that sorts after them all."""
    for name in (bench.ANCHOR_FILE, bench.REFERENCE_FILE, bench.GRAPH_FILE):
        shutil.copy(RESULTS / name, tmp_path / name)
    decoy = json.loads((RESULTS / bench.REFERENCE_FILE).read_text())
    for level in decoy["levels"]:
        level["rtf_p50"] = 99.0
    (tmp_path / "runtime-h200-2099-12-31-zzz.json").write_text(json.dumps(decoy))
    return tmp_path


def test_each_calibration_reads_its_file_by_name_never_the_newest(results_with_a_decoy: Path):
    anchor = bench.anchor_calibration(results_with_a_decoy)
    reference = bench.measured_calibration("reference", bench.REFERENCE_FILE, "ref", results_with_a_decoy)
    graph = bench.measured_calibration("graph", bench.GRAPH_FILE, "graph", results_with_a_decoy)
    assert bench.ANCHOR_FILE in anchor.text and bench.REFERENCE_FILE in reference.text and bench.GRAPH_FILE in graph.text
    # The decoy's 99 x 21.3 ms steps appear nowhere; the graph engine is faster than the reference one.
    for calibration in (anchor, reference, graph):
        assert max(t for _, t in calibration.model.step_table) < 0.1
    assert graph.model.step_seconds(16) < reference.model.step_seconds(16)


def _minute_means(trace) -> np.ndarray:
    return trace.rate[: int(trace.duration) // 60 * 60].reshape(-1, 60).mean(axis=1)


def test_the_new_load_shapes_are_what_their_names_say():
    crowd = traces.crowd()
    assert crowd.rate[2460:4200].mean() / crowd.rate[:2400].mean() == pytest.approx(10.0, rel=0.1)
    assert crowd.rate[2470] > 8 * crowd.rate[2390]  # within one minute
    square = _minute_means(traces.square())
    assert square[:5].mean() < 6.0 < square[6:10].mean()  # 5.5-minute halves: low first, then high
    lull = traces.lull()
    assert lull.rate[3600:6000].mean() / lull.rate[:3600].mean() == pytest.approx(1 / 9, rel=0.15)
    assert lull.rate[6000:7000].mean() < lull.rate[10000:11400].mean() < lull.rate[11400:].mean() * 1.05
    assert traces.outage().outages == ((4500.0, 4800.0),)


class Recorder:
    name = "recorder"

    def __init__(self):
        self.seen = []

    def evaluate(self, now, current, sample):
        self.seen.append((now, sample))
        return current


def test_the_harness_drops_every_scrape_of_an_outage():
    recorder = Recorder()
    arrivals = np.arange(0.0, 300.0, 0.5)
    simulate(FleetModel(), arrivals, np.full(len(arrivals), 100.0), recorder, 1, 300.0, seed=1,
             outages=((100.0, 160.0),))
    blind = [now for now, sample in recorder.seen if sample is None]
    assert blind == [105.0, 120.0, 135.0, 150.0]
    assert all(sample is not None for now, sample in recorder.seen if now not in blind)


def test_the_clairvoyant_bound_sizes_for_the_rate_now_up_and_down_at_once():
    rate = np.array([1.0] * 10 + [20.0] * 10 + [1.0] * 10)
    bound = ClairvoyantAtArrival(rate, per_replica_rate=4.0, min_replicas=1, max_replicas=16, headroom=1.0)
    assert bound.evaluate(5.0, 1, None) == 1
    assert bound.evaluate(12.0, 1, None) == 5  # 20 / 4 at once: no rate policy, no metric
    assert bound.evaluate(25.0, 5, None) == 1  # down at once
    held = ClairvoyantAtArrival(rate, per_replica_rate=4.0, min_replicas=1, max_replicas=16, held=2, headroom=1.4)
    assert held.name == "clairvoyant at arrival, 2 held" and held.lower == 2
    assert held.evaluate(5.0, 1, None) == 2  # the spare, whatever the load
    assert held.evaluate(12.0, 2, None) == 7  # ceil(20 x 1.4 / 4)
    assert ClairvoyantAtArrival(rate * 10, 4.0, 1, 16).evaluate(12.0, 1, None) == 16  # maxReplicas bounds it


def _run(name, violations, hours, flaps=0, held=None):
    run = {"autoscaler": name, "slo_violation_minutes": violations, "replica_hours": hours,
           "flaps_under_10min": flaps}
    return run if held is None else {**run, "held": held}


def _bound(held, violations, hours):
    return _run(f"clairvoyant at arrival, {held} held", violations, hours, held=held)


def _raw(ours, bounds):
    runs = [ours, _run("HPA (wait quantile)", 10, 10.0), _run("KEDA (waiting > 5)", 20, 12.0)] + bounds
    return [{"calibration": "anchor", "results": [{"title": "t", "runs": runs}]}]


@pytest.mark.parametrize(("ours", "bounds", "expected"), [
    (_run("operator", 5, 9.0), [_bound(1, 6, 4.0), _bound(16, 0, 32.0)], "met"),
    # Missed, and a bound with a spare held meets both criteria: reachable.
    (_run("operator", 6, 9.0), [_bound(1, 7, 4.0), _bound(2, 4, 6.0), _bound(16, 0, 32.0)], "not met (reachable)"),
    # Missed, no bound row meets both, yet 16 Ready from the start would: not shown impossible.
    (_run("operator", 6, 9.0), [_bound(1, 7, 4.0), _bound(2, 6, 6.0), _bound(16, 0, 32.0)], "not met"),
    # Even maxReplicas Ready from the start has more than half of HPA's: impossible (shown).
    (_run("operator", 6, 9.0), [_bound(1, 8, 4.0), _bound(16, 6, 32.0)], "impossible (shown)"),
    # A miss the bound cannot excuse (a quick reversal) is never impossible.
    (_run("operator", 6, 9.0, flaps=1), [_bound(1, 8, 4.0), _bound(16, 6, 32.0)], "not met"),
])
def test_the_bar_says_met_not_met_or_impossible_shown(ours, bounds, expected):
    [row] = verdicts(_raw(ours, bounds))
    assert verdict(row) == expected
    assert f"| {expected} |" in bar_section(_raw(ours, bounds))


def test_the_bar_never_excuses_replica_hours_above_hpa():
    # Half of HPA's violation minutes met, replica-hours above HPA's: a miss, never impossible.
    [row] = verdicts(_raw(_run("operator", 3, 11.0), [_bound(1, 8, 4.0), _bound(16, 6, 32.0)]))
    assert verdict(row) == "not met"


def test_the_harness_drops_only_the_wait_of_a_wait_outage():
    recorder = Recorder()
    arrivals = np.arange(0.0, 300.0, 0.5)
    simulate(FleetModel(), arrivals, np.full(len(arrivals), 100.0), recorder, 1, 300.0, seed=1,
             wait_outages=((100.0, 160.0),))
    lost = [(now, s) for now, s in recorder.seen if 100.0 <= now < 160.0]
    assert [now for now, _ in lost] == [105.0, 120.0, 135.0, 150.0]
    assert all(s.wait_quantile is None and s.observed_requests is None and s.requests_waiting is not None
               and s.requests_running is not None for _, s in lost)
    assert all(s.wait_quantile is not None for now, s in recorder.seen if not 100.0 <= now < 160.0)


def test_the_blind_traces_lose_the_metric_at_each_onset():
    blind = traces.blindburst()
    onsets = [t for t in range(1, len(blind.rate)) if blind.rate[t] > 2.5 * blind.rate[t - 1]]
    assert onsets == [1500, 3900, 6300, 8700]
    spans = sorted(blind.wait_outages + blind.outages)
    assert [onset - start for onset, (start, _) in zip(onsets, spans)] == [30.0, 0.0, 0.0, -20.0]
    crowd = traces.blindcrowd()
    assert crowd.wait_outages == ((2385.0, 2985.0),) and crowd.rate[2470] > 8 * crowd.rate[2380]


def test_hpa_and_keda_hold_without_their_own_metric():
    from bench.autoscaler.policies import Hpa, Keda
    from chattts_operator.autoscaling import FleetSample

    no_wait = FleetSample(time=15.0, wait_quantile=None, requests_running=30.0, requests_waiting=40.0)
    assert Hpa(0.005, 1, 16).evaluate(15.0, 3, no_wait) == 3
    assert Keda(5.0, 1, 16).evaluate(15.0, 3, no_wait) == 7  # its metric (waiting) answers: 8, +4 per 15 s
