"""The replaceable clock the share-policy handler reads."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from chattts_operator.core import clock


def test_manual_clock_is_installed_and_restored():
    start = datetime(2026, 3, 29, 0, 30, tzinfo=timezone(timedelta(hours=1)))
    manual = clock.ManualClock(start)
    clock.set_clock(manual)
    try:
        assert clock.now() == start and clock.now().tzinfo == timezone.utc
        manual.advance(timedelta(hours=2))
        assert clock.now() == datetime(2026, 3, 29, 1, 30, tzinfo=timezone.utc)
    finally:
        clock.set_clock(None)
    assert abs((clock.now() - datetime.now(timezone.utc)).total_seconds()) < 5


def test_naive_times_are_refused():
    with pytest.raises(ValueError, match="aware"):
        clock.ManualClock(datetime(2026, 1, 1))
    clock.set_clock(lambda: datetime(2026, 1, 1))
    try:
        with pytest.raises(ValueError, match="naive"):
            clock.now()
    finally:
        clock.set_clock(None)
