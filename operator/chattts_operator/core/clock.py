"""The operator's clock, replaceable by tests; RFC 3339 stamps for status and Events.

Window changes depend on wall-clock time; tests compress a day into minutes by
installing their own clock (``set_clock``) before the operator starts, instead of
patching ``datetime``. The clock returns an aware UTC datetime.
"""
from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from typing import Callable

from chattts_operator.api.common import format_time

Clock = Callable[[], datetime]


def system_clock() -> datetime:
    return datetime.now(timezone.utc)


_clock: Clock = system_clock


def set_clock(clock: Clock | None) -> None:
    """Install ``clock`` (None restores the system clock)."""
    global _clock
    _clock = clock or system_clock


def now() -> datetime:
    value = _clock()
    if value.tzinfo is None:
        raise ValueError("the installed clock returned a naive datetime; return an aware one (UTC)")
    return value.astimezone(timezone.utc)


def rfc3339(instant: datetime | None = None) -> str:
    """``instant`` (default: the operator's clock's now, so a test clock stamps status too) as the API's
    timestamp, to the second."""
    return format_time(instant if instant is not None else now())


class ManualClock:
    """A clock that moves only when told (thread-safe: kopf runs in its own thread in tests)."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware start time")
        self._now = start.astimezone(timezone.utc)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, instant: datetime) -> None:
        with self._lock:
            self._now = instant.astimezone(timezone.utc)

    def advance(self, delta: timedelta) -> datetime:
        with self._lock:
            self._now += delta
            return self._now
