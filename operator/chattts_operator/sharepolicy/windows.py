"""Which window of a GPUSharePolicy is in force at an instant, and when that changes.

Pure: instants in, window names and instants out. Every instant is a timezone-aware
``datetime``; results are in UTC. Local wall-clock times are turned into instants with
``zoneinfo`` (fold=0): a local time skipped by a spring-forward change is shifted forward
by the gap, an ambiguous one (fall back) means its first occurrence.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Iterable, Sequence
from zoneinfo import ZoneInfo

from chattts_operator.api.sharepolicy import (
    GPUSharePolicySpec,
    OverlapRule,
    ScheduleWindow,
    Shares,
    parse_clock_time,
)

# How far ahead next_change looks: a week covers every weekday pattern, plus a day for
# windows that cross midnight.
_LOOKAHEAD_DAYS = 8


@dataclass(frozen=True)
class Occurrence:
    """One window on one local start date, as a half-open UTC interval [start, end)."""

    window: ScheduleWindow
    index: int  # position in spec.windows (FirstListed)
    local_date: date
    start: datetime
    end: datetime

    def contains(self, instant: datetime) -> bool:
        return self.start <= instant < self.end


@dataclass(frozen=True)
class Resolution:
    """What is in force at an instant."""

    window: str  # '' when no window is active (default shares)
    shares: Shares
    started: datetime | None  # when the winning occurrence started (None for default)
    next_change: datetime | None  # the next instant at which ``window`` changes; None if never within a week


def _require_aware(instant: datetime) -> datetime:
    if instant.tzinfo is None or instant.utcoffset() is None:
        raise ValueError(f"instant {instant!r} has no timezone: pass an aware datetime (e.g. in UTC)")
    return instant.astimezone(timezone.utc)


def local_instant(day: date, hhmm: str, zone: ZoneInfo) -> datetime:
    """The UTC instant of wall-clock ``hhmm`` on ``day`` in ``zone`` ('24:00' is the next midnight)."""
    hours, minutes = parse_clock_time(hhmm)
    if hours == 24:
        day, hours = day + timedelta(days=1), 0
    wall = datetime(day.year, day.month, day.day, hours, minutes, tzinfo=zone)  # fold=0
    # A wall time in a spring-forward gap: fold=0 applies the offset from before the change,
    # which lands after the gap once converted (02:30 -> 03:30 local). Round-tripping makes
    # that explicit and keeps the result an exact instant.
    return wall.astimezone(timezone.utc)


def occurrence(window: ScheduleWindow, index: int, day: date, zone: ZoneInfo) -> Occurrence | None:
    """The window's occurrence starting on local ``day``, or None if it does not run that day."""
    if window.days and day.weekday() not in {d.index for d in window.days}:
        return None
    start = local_instant(day, window.start, zone)
    end_day = day + timedelta(days=1) if window.crosses_midnight else day
    end = local_instant(end_day, window.end, zone)
    if end <= start:
        # Only possible when a DST change swallows the whole window (e.g. 02:00-02:30 on
        # the spring-forward day): it does not run that day.
        return None
    return Occurrence(window=window, index=index, local_date=day, start=start, end=end)


def occurrences(spec: GPUSharePolicySpec, first: date, last: date) -> list[Occurrence]:
    """Every occurrence whose local start date is within [first, last], sorted by start."""
    zone = spec.zone
    found: list[Occurrence] = []
    day = first
    while day <= last:
        for index, window in enumerate(spec.windows):
            occ = occurrence(window, index, day, zone)
            if occ is not None:
                found.append(occ)
        day += timedelta(days=1)
    found.sort(key=lambda o: (o.start, o.index))
    return found


def pick(active: Sequence[Occurrence], rule: OverlapRule) -> Occurrence | None:
    """The winner among occurrences active at the same instant."""
    if not active:
        return None
    if rule is OverlapRule.FIRST_LISTED:
        return min(active, key=lambda o: (o.index, o.start))
    # LatestStart: the most recently started wins; ties go to the earlier-listed window.
    return min(active, key=lambda o: (-o.start.timestamp(), o.index))


def _winner(occs: Iterable[Occurrence], instant: datetime, rule: OverlapRule) -> Occurrence | None:
    return pick([o for o in occs if o.contains(instant)], rule)


def resolve(spec: GPUSharePolicySpec, now: datetime) -> Resolution:
    """The window in force at ``now`` and the next instant at which that changes."""
    now = _require_aware(now)
    today = now.astimezone(spec.zone).date()
    # Yesterday's windows may still run (midnight crossing); look a week ahead for changes.
    occs = occurrences(spec, today - timedelta(days=1), today + timedelta(days=_LOOKAHEAD_DAYS))
    current = _winner(occs, now, spec.overlap)
    current_name = current.window.name if current else ""

    next_change: datetime | None = None
    # Occurrences starting after the last looked-at day are missing, so an instant past its
    # midnight could look like a change that is not one.
    horizon = local_instant(today + timedelta(days=_LOOKAHEAD_DAYS), "00:00", spec.zone)
    boundaries = sorted({t for o in occs for t in (o.start, o.end) if now < t < horizon})
    for boundary in boundaries:
        winner = _winner(occs, boundary, spec.overlap)
        if (winner.window.name if winner else "") != current_name:
            next_change = boundary
            break

    if current is None:
        return Resolution(window="", shares=spec.default_shares, started=None, next_change=next_change)
    return Resolution(
        window=current_name, shares=current.window.shares, started=current.start, next_change=next_change
    )


def overlapping_windows(spec: GPUSharePolicySpec, around: datetime) -> list[tuple[str, str]]:
    """Pairs of window names that overlap in the week from ``around``: reported in status
    so a user sees that the overlap rule is deciding."""
    around = _require_aware(around)
    today = around.astimezone(spec.zone).date()
    occs = occurrences(spec, today - timedelta(days=1), today + timedelta(days=7))
    pairs: set[tuple[str, str]] = set()
    for i, a in enumerate(occs):
        for b in occs[i + 1:]:
            if b.start >= a.end:
                continue
            if a.window.name != b.window.name and a.start < b.end:
                pairs.add(tuple(sorted((a.window.name, b.window.name))))  # type: ignore[arg-type]
    return sorted(pairs)
