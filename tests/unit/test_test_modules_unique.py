"""pytest imports test files by basename (rootdir-relative, no packages): two of one name in one run stop
the whole run at collection ("import file mismatch"), as tests/unit and tests/cluster's test_cel_drift.py did.
`make test` runs tests/vllm_engine in a run of its own, so only the names within each run must differ."""
from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_of_one_pytest_run_share_a_name():
    runs = {"main": [p for p in TESTS.rglob("test_*.py") if "vllm_engine" not in p.parts],
            "vllm_engine": list((TESTS / "vllm_engine").rglob("test_*.py"))}
    for run, paths in runs.items():
        names = collections.Counter(p.name for p in paths)
        twice = {name: sorted(str(p.relative_to(TESTS)) for p in paths if p.name == name)
                 for name, n in names.items() if n > 1}
        assert not twice, f"{run} run: test modules sharing a name: {twice}"
