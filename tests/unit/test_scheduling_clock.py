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


def test_status_stamps_follow_the_installed_clock():
    # Status and Events are stamped by the operator's clock, not the system's: a test clock moves them too.
    clock.set_clock(clock.ManualClock(datetime(2031, 5, 6, 7, 8, 9, 987654, tzinfo=timezone.utc)))
    try:
        assert clock.rfc3339() == "2031-05-06T07:08:09Z"
    finally:
        clock.set_clock(None)
    # One formatter for datetimes and epoch seconds (the autoscaler's clock), to the second, in UTC.
    from chattts_operator.api.common import format_time, parse_time

    assert format_time(datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1)))) == "2026-01-01T00:00:00Z"
    assert format_time(1000.9) == "1970-01-01T00:16:40Z" and parse_time("1970-01-01T00:16:40Z") == 1000.0
    with pytest.raises(ValueError, match="aware"):
        format_time(datetime(2026, 1, 1))
