"""The operator-scale bench's pure parts: alternating create pairs (pairs.py) and the operator's own request count (apimetrics.py)."""
from __future__ import annotations

import pytest

from bench.operator_scale import pairs, report


@pytest.mark.parametrize("count, expected", [
    (1, ["baseline", "operator"]),
    (2, ["operator", "baseline", "baseline", "operator"]),
    (3, ["baseline", "operator", "operator", "baseline", "baseline", "operator"]),
])
def test_the_order_alternates_and_the_operator_always_runs_last(count, expected):
    assert pairs.side_order(count) == expected


def test_no_pairs_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        pairs.side_order(0)


def side(kind: str, seconds: float | None, ready: float | None = None) -> tuple[str, dict]:
    if kind == pairs.BASELINE:
        return kind, {"seconds_children_exist": seconds, "seconds_deployments_ready": ready}
    return kind, {"seconds_children_and_status": seconds, "seconds_ready": ready, "writes_per_object": 5.2}


def test_each_pair_is_the_operator_over_its_own_baseline_whatever_the_order():
    done = [side("baseline", 100, 110), side("operator", 96, 99),
            side("operator", 140, 150), side("baseline", 100, 100),
            side("baseline", 80, 90), side("operator", 100, 90)]
    summed = pairs.pair_up(done)
    assert [p["ratio"] for p in summed] == [0.96, 1.4, 1.25]
    assert [p["order"] for p in summed] == ["baseline first", "operator first", "baseline first"]
    assert [p["ready_ratio"] for p in summed] == [0.9, 1.5, 1.0]
    assert pairs.summary(summed) == {"pairs": 3, "complete": 3, "median_ratio": 1.25, "min_ratio": 0.96,
                                     "max_ratio": 1.4, "median_ready_ratio": 1.0}


def test_a_side_that_failed_leaves_its_pair_out_of_the_median_not_the_count():
    done = [side("baseline", 100), side("operator", 110), side("operator", None), side("baseline", 100)]
    summed = pairs.pair_up(done)
    assert summed[1]["ratio"] is None
    assert pairs.summary(summed)["median_ratio"] == 1.1
    assert pairs.summary(summed)["complete"] == 1
    assert pairs.summary([])["median_ratio"] is None


def test_the_report_puts_the_goal_on_the_median_when_there_are_pairs():
    done = [side("baseline", 100, 100), side("operator", 150, 150), side("operator", 100, 100),
            side("baseline", 100, 100), side("baseline", 100, 100), side("operator", 110, 110)]
    results = {"sizes": [1000], "baseline_1000": done[-2][1], "operator_1000": done[-1][1],
               "create_pairs_1000": pairs.pair_up(done)}
    results["create_summary_1000"] = pairs.summary(results["create_pairs_1000"])
    rows = {figure: (value, goal) for figure, value, goal in report.rows(results)}
    median = rows["N=1000: ratio, median of 3 alternating pairs, each side on a fresh control plane"]
    assert median[0].startswith("1.10x (pairs: 1.50x (baseline first), 1.00x (operator first), 1.10x (baseline first))")
    assert median[1] == "<= 1.2x"
    assert rows["N=1000: ratio operator / bare writes (the last pair)"] == ("1.10x", "")


def test_the_operators_own_count_is_a_window_of_its_counter_per_object():
    from bench.operator_scale import apimetrics

    before = {"PATCH deployments": 10, "GET nodes": 1}
    after = {"PATCH deployments": 210, "GET nodes": 1, "PATCH chattsdeployments/status": 230, "POST events": 60}
    window = apimetrics.own_window(after, before)
    assert window == {"PATCH chattsdeployments/status": 230, "PATCH deployments": 200, "POST events": 60}
    assert apimetrics.own_per_object(window, 200) == {"requests": 2.45, "writes": 2.45, "status_patches": 1.15,
                                                     "events": 0.3}
