"""Window resolution of GPUSharePolicy: midnight crossing, weekdays, DST days, overlaps."""
from __future__ import annotations

from datetime import date, datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from chattts_operator.api.sharepolicy import GPUSharePolicySpec
from chattts_operator.sharepolicy.windows import local_instant, occurrence, overlapping_windows, resolve

UTC = timezone.utc


def utc(y, mo, d, h=0, mi=0):
    return datetime(y, mo, d, h, mi, tzinfo=UTC)


def spec(windows, tz="UTC", overlap="LatestStart", default=None):
    body = {"nodeSelector": {}, "timezone": tz, "windows": windows, "overlap": overlap}
    if default is not None:
        body["defaultShares"] = default
    return GPUSharePolicySpec.model_validate(body)


DAY = {"name": "day", "start": "08:00", "end": "20:00", "online": 80, "offline": 20}
NIGHT = {"name": "night", "start": "20:00", "end": "08:00", "online": 60, "offline": 40}
BERLIN_DAY_NIGHT = spec([DAY, NIGHT], tz="Europe/Berlin")

# (case, spec, now, expected window, expected next change)
CASES = [
    # Berlin is UTC+1 in winter: day 07:00Z-19:00Z, night 19:00Z-07:00Z.
    ("winter day", BERLIN_DAY_NIGHT, utc(2026, 11, 30, 12), "day", utc(2026, 11, 30, 19)),
    ("day starts exactly", BERLIN_DAY_NIGHT, utc(2026, 11, 30, 7), "day", utc(2026, 11, 30, 19)),
    ("one minute before day", BERLIN_DAY_NIGHT, utc(2026, 11, 30, 6, 59), "night", utc(2026, 11, 30, 7)),
    ("night before midnight", BERLIN_DAY_NIGHT, utc(2026, 11, 30, 22), "night", utc(2026, 12, 1, 7)),
    ("night after midnight (started yesterday)", BERLIN_DAY_NIGHT, utc(2026, 12, 1, 2), "night", utc(2026, 12, 1, 7)),
    # Summer: UTC+2.
    ("summer day", BERLIN_DAY_NIGHT, utc(2026, 7, 1, 6, 30), "day", utc(2026, 7, 1, 18)),
    # DST ends in Berlin on 2026-10-25 03:00 CEST -> 02:00 CET: that night lasts 13 hours.
    ("fall-back night", BERLIN_DAY_NIGHT, utc(2026, 10, 24, 20), "night", utc(2026, 10, 25, 7)),
    # DST starts in Berlin on 2026-03-29 02:00 CET -> 03:00 CEST: that night lasts 11 hours.
    ("spring-forward night", BERLIN_DAY_NIGHT, utc(2026, 3, 28, 20), "night", utc(2026, 3, 29, 6)),
    ("no windows", spec([]), utc(2026, 1, 1), "", None),
]


@pytest.mark.parametrize("case, policy, now, window, next_change", CASES, ids=[c[0] for c in CASES])
def test_resolve_table(case, policy, now, window, next_change):
    got = resolve(policy, now)
    assert got.window == window
    assert got.next_change == next_change


def test_dst_night_lengths_in_berlin():
    fall = occurrence(BERLIN_DAY_NIGHT.windows[1], 1, date(2026, 10, 24), ZoneInfo("Europe/Berlin"))
    spring = occurrence(BERLIN_DAY_NIGHT.windows[1], 1, date(2026, 3, 28), ZoneInfo("Europe/Berlin"))
    normal = occurrence(BERLIN_DAY_NIGHT.windows[1], 1, date(2026, 6, 10), ZoneInfo("Europe/Berlin"))
    assert (fall.end - fall.start).total_seconds() == 13 * 3600
    assert (spring.end - spring.start).total_seconds() == 11 * 3600
    assert (normal.end - normal.start).total_seconds() == 12 * 3600


NY = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    "day, hhmm, expected",
    [
        # 2026-03-08: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist and shifts forward.
        (date(2026, 3, 8), "01:59", utc(2026, 3, 8, 6, 59)),
        (date(2026, 3, 8), "02:30", utc(2026, 3, 8, 7, 30)),
        (date(2026, 3, 8), "03:00", utc(2026, 3, 8, 7, 0)),
        # 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:30 is ambiguous: first occurrence (EDT).
        (date(2026, 11, 1), "01:30", utc(2026, 11, 1, 5, 30)),
        (date(2026, 11, 1), "02:00", utc(2026, 11, 1, 7, 0)),
        (date(2026, 11, 1), "24:00", utc(2026, 11, 2, 5, 0)),
    ],
)
def test_local_instant_on_dst_days(day, hhmm, expected):
    assert local_instant(day, hhmm, NY) == expected


def test_window_swallowed_by_spring_forward_does_not_run_that_day():
    policy = spec([{"name": "gap", "start": "02:30", "end": "03:00", "online": 10, "offline": 90}], tz="America/New_York")
    assert occurrence(policy.windows[0], 0, date(2026, 3, 8), NY) is None
    assert occurrence(policy.windows[0], 0, date(2026, 3, 9), NY) is not None
    assert resolve(policy, utc(2026, 3, 8, 7, 15)).window == ""


WEEKDAYS = spec(
    [
        {"name": "office", "start": "08:00", "end": "20:00", "days": ["Mon", "Tue", "Wed", "Thu", "Fri"], "online": 90, "offline": 10},
        {"name": "fri-night", "start": "22:00", "end": "06:00", "days": ["Fri"], "online": 20, "offline": 80},
    ],
    default={"online": 50, "offline": 50},
)

# 2026-11-27 is a Friday.
WEEKDAY_CASES = [
    ("friday office", utc(2026, 11, 27, 19, 59), "office", utc(2026, 11, 27, 20)),
    ("friday after office: default", utc(2026, 11, 27, 20), "", utc(2026, 11, 27, 22)),
    ("friday night before midnight", utc(2026, 11, 27, 23), "fri-night", utc(2026, 11, 28, 6)),
    ("friday night on saturday morning", utc(2026, 11, 28, 5, 59), "fri-night", utc(2026, 11, 28, 6)),
    ("saturday daytime: default until monday", utc(2026, 11, 28, 9), "", utc(2026, 11, 30, 8)),
    ("sunday late: no sunday night window", utc(2026, 11, 29, 23), "", utc(2026, 11, 30, 8)),
    ("monday 08:00 exactly", utc(2026, 11, 30, 8), "office", utc(2026, 11, 30, 20)),
    ("thursday night: fri-night is friday only", utc(2026, 11, 26, 23), "", utc(2026, 11, 27, 8)),
]


@pytest.mark.parametrize("case, now, window, next_change", WEEKDAY_CASES, ids=[c[0] for c in WEEKDAY_CASES])
def test_weekday_boundaries(case, now, window, next_change):
    got = resolve(WEEKDAYS, now)
    assert got.window == window
    assert got.next_change == next_change
    expected_shares = {"office": (90, 10), "fri-night": (20, 80), "": (50, 50)}[window]
    assert (got.shares.online, got.shares.offline) == expected_shares


PEAK = {"name": "peak", "start": "12:00", "end": "14:00", "online": 100, "offline": 0}

OVERLAP_CASES = [
    ("latest start: peak wins inside day", "LatestStart", utc(2026, 6, 1, 13), "peak", utc(2026, 6, 1, 14)),
    ("latest start: day before peak", "LatestStart", utc(2026, 6, 1, 11), "day", utc(2026, 6, 1, 12)),
    ("latest start: back to day after peak", "LatestStart", utc(2026, 6, 1, 14), "day", utc(2026, 6, 1, 20)),
    ("first listed: day shadows peak", "FirstListed", utc(2026, 6, 1, 13), "day", utc(2026, 6, 1, 20)),
    ("first listed: day then night", "FirstListed", utc(2026, 6, 1, 11), "day", utc(2026, 6, 1, 20)),
]


@pytest.mark.parametrize("case, rule, now, window, next_change", OVERLAP_CASES, ids=[c[0] for c in OVERLAP_CASES])
def test_overlap_rule(case, rule, now, window, next_change):
    policy = spec([DAY, PEAK, NIGHT], overlap=rule)
    got = resolve(policy, now)
    assert got.window == window
    assert got.next_change == next_change


def test_latest_start_prefers_the_window_that_started_last_across_midnight():
    # A long night window and a short early-morning maintenance window inside it.
    policy = spec([NIGHT, {"name": "maint", "start": "02:00", "end": "03:00", "online": 0, "offline": 100}])
    assert resolve(policy, utc(2026, 6, 2, 2, 30)).window == "maint"
    assert resolve(policy, utc(2026, 6, 2, 3, 0)).window == "night"


def test_overlapping_windows_are_reported():
    assert overlapping_windows(spec([DAY, PEAK, NIGHT]), utc(2026, 6, 1)) == [("day", "peak")]
    assert overlapping_windows(BERLIN_DAY_NIGHT, utc(2026, 6, 1)) == []


def test_window_ending_at_2400():
    policy = spec([{"name": "evening", "start": "18:00", "end": "24:00", "online": 50, "offline": 50}])
    assert resolve(policy, utc(2026, 6, 1, 23, 59)).window == "evening"
    assert resolve(policy, utc(2026, 6, 2, 0, 0)).window == ""
    assert resolve(policy, utc(2026, 6, 1, 19)).next_change == utc(2026, 6, 2, 0)


def test_back_to_back_windows_of_the_same_name_are_no_change():
    policy = spec([{"name": "always", "start": "00:00", "end": "24:00", "online": 70, "offline": 30}])
    got = resolve(policy, utc(2026, 6, 1, 12))
    assert got.window == "always"
    assert got.next_change is None


def test_naive_instant_is_rejected():
    with pytest.raises(ValueError, match="no timezone"):
        resolve(BERLIN_DAY_NIGHT, datetime(2026, 1, 1, 12))
