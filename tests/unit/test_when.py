"""Points in time as users type them (``reserve --start/--end``), in their own time zone.

Every test runs in Europe/Berlin (fixture below), so "today" and "14:00" are fixed; expected
values come from zoneinfo, not from the code under test."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from zoneinfo import ZoneInfo

import pytest

from gpuclaim.core.errors import UsageError
from gpuclaim.core.model import iso as model_iso
from gpuclaim.core.when import format_when, iso_local, parse_when

BERLIN = ZoneInfo("Europe/Berlin")
TOKYO = ZoneInfo("Asia/Tokyo")


@pytest.fixture(autouse=True)
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()  # before tzset: the process's zone must be the one it had
    time.tzset()


def at(
    y: int,
    mo: int,
    d: int,
    h: int = 0,
    mi: int = 0,
    s: int = 0,
    *,
    fold: int = 0,
    tz: dt.tzinfo = BERLIN,
) -> float:
    return dt.datetime(y, mo, d, h, mi, s, tzinfo=tz, fold=fold).timestamp()


NOW = at(2026, 12, 2, 15, 30)  # a Wednesday


@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", NOW),
        ("NOW", NOW),
        ("+90s", NOW + 90),
        ("+2h", NOW + 7200),
        ("+1h30m", NOW + 5400),
        ("+2d", NOW + 2 * 86400),
        ("+1-12:00:00", NOW + 36 * 3600),  # whatever parse_duration reads
        ("16:00", at(2026, 12, 2, 16, 0)),
        ("9:05", at(2026, 12, 2, 9, 5)),  # passed: returned as is, the caller refuses it
        ("16:00:30", at(2026, 12, 2, 16, 0, 30)),
        ("00:00", at(2026, 12, 2, 0, 0)),
        ("23:59:59", at(2026, 12, 2, 23, 59, 59)),
        ("9am", at(2026, 12, 2, 9, 0)),
        ("5pm", at(2026, 12, 2, 17, 0)),
        ("5 pm", at(2026, 12, 2, 17, 0)),
        ("5:30PM", at(2026, 12, 2, 17, 30)),
        ("12am", at(2026, 12, 2, 0, 0)),
        ("12pm", at(2026, 12, 2, 12, 0)),
        ("12:15am", at(2026, 12, 2, 0, 15)),
        ("today", at(2026, 12, 2, 0, 0)),
        ("today 17:00", at(2026, 12, 2, 17, 0)),
        ("tomorrow 09:00", at(2026, 12, 3, 9, 0)),
        ("tomorrow 9:30pm", at(2026, 12, 3, 21, 30)),
        ("tomorrow", at(2026, 12, 3, 0, 0)),
        ("2026-12-03", at(2026, 12, 3, 0, 0)),
        ("2026-12-03T09:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03 09:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03T09:00:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03 09:00:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03t09:00", at(2026, 12, 3, 9, 0)),
        ("2026-06-01T09:00", at(2026, 6, 1, 9, 0)),  # local in summer: +02:00
        ("  Tomorrow   09:00 ", at(2026, 12, 3, 9, 0)),
    ],
)
def test_every_form(text: str, expected: float) -> None:
    assert parse_when(text, NOW) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("thu 09:00", at(2026, 12, 3, 9, 0)),
        ("Thursday 9am", at(2026, 12, 3, 9, 0)),
        ("fri", at(2026, 12, 4, 0, 0)),
        ("SAT 17:00", at(2026, 12, 5, 17, 0)),
        ("sunday 23:59", at(2026, 12, 6, 23, 59)),
        ("mon", at(2026, 12, 7, 0, 0)),
        ("tuesday 8:15", at(2026, 12, 8, 8, 15)),
        ("wed 16:00", at(2026, 12, 2, 16, 0)),  # today, still ahead
        ("wednesday 4pm", at(2026, 12, 2, 16, 0)),
        ("wed 09:00", at(2026, 12, 9, 9, 0)),  # today but passed: next week
        ("wed 15:30", at(2026, 12, 9, 15, 30)),  # exactly now is not ahead
        ("wed", at(2026, 12, 9, 0, 0)),  # today's midnight has passed
    ],
)
def test_a_weekday_is_the_next_one(text: str, expected: float) -> None:
    assert parse_when(text, NOW) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2026-12-03T08:00:00Z", at(2026, 12, 3, 9, 0)),
        ("2026-12-03T08:00z", at(2026, 12, 3, 9, 0)),
        ("2026-12-03T09:00+01:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03T10:00+02:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03 03:00:00-05:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03T08:00+00:00", at(2026, 12, 3, 9, 0)),
        ("2026-06-01T09:00+01:00", at(2026, 6, 1, 10, 0)),  # the offset wins over summer's
        ("2026-12-03T08:00:00.000Z", at(2026, 12, 3, 9, 0)),  # as --json writes it
        ("2026-12-03T08:00:00.5Z", at(2026, 12, 3, 9, 0) + 0.5),
        ("2026-12-03T09:00:00.250000", at(2026, 12, 3, 9, 0) + 0.25),
    ],
)
def test_an_explicit_offset_wins_over_the_local_zone(text: str, expected: float) -> None:
    assert parse_when(text, NOW) == expected


def test_an_end_is_the_first_such_time_after_the_start() -> None:
    start = at(2026, 12, 2, 22, 0)
    assert parse_when("02:00", NOW, after=start) == at(2026, 12, 3, 2, 0)
    assert parse_when("23:00", NOW, after=start) == at(2026, 12, 2, 23, 0)
    assert parse_when("10pm", NOW, after=start) == at(2026, 12, 3, 22, 0)  # strictly after
    assert parse_when("9am", NOW, after=start) == at(2026, 12, 3, 9, 0)


def test_an_end_counts_from_a_start_days_ahead() -> None:
    start = at(2026, 12, 10, 22, 0)
    assert parse_when("02:00", NOW, after=start) == at(2026, 12, 11, 2, 0)
    assert parse_when("23:30", NOW, after=start) == at(2026, 12, 10, 23, 30)


def test_after_moves_only_a_bare_time_of_day() -> None:
    start = at(2026, 12, 2, 22, 0)
    assert parse_when("+1h", NOW, after=start) == NOW + 3600  # relative is from now
    assert parse_when("today 17:00", NOW, after=start) == at(2026, 12, 2, 17, 0)
    assert parse_when("thu 09:00", NOW, after=start) == at(2026, 12, 3, 9, 0)
    assert parse_when("2026-12-02T20:00", NOW, after=start) == at(2026, 12, 2, 20, 0)


@pytest.mark.parametrize(
    "text, now, expected",
    [
        # 2026-03-29: 02:00-03:00 does not exist in Berlin; fold=0 reads it with the old offset
        ("02:30", at(2026, 3, 29, 1, 0), at(2026, 3, 29, 2, 30)),
        ("tomorrow 02:30", at(2026, 3, 28, 12, 0), at(2026, 3, 29, 2, 30)),
        ("sun 02:30", at(2026, 3, 28, 12, 0), at(2026, 3, 29, 2, 30)),
        ("2026-03-29T02:30", NOW, at(2026, 3, 29, 2, 30)),
        # 2026-10-25: 02:00-03:00 happens twice; fold=0 is the first (summer) one
        ("02:30", at(2026, 10, 25, 0, 0), at(2026, 10, 25, 2, 30)),
        ("tomorrow 02:30", at(2026, 10, 24, 12, 0), at(2026, 10, 25, 2, 30)),
        ("2026-10-25 02:30", NOW, at(2026, 10, 25, 2, 30)),
    ],
)
def test_dst_gaps_and_folds_do_not_raise(text: str, now: float, expected: float) -> None:
    assert parse_when(text, now) == expected


def test_a_day_step_keeps_the_wall_time_across_dst() -> None:
    before = at(2026, 3, 28, 9, 0)
    assert parse_when("tomorrow 09:00", before) - before == 23 * 3600
    start = at(2026, 10, 24, 22, 0)
    assert parse_when("02:30", start, after=start) == at(2026, 10, 25, 2, 30)
    assert parse_when("09:00", start, after=start) - at(2026, 10, 24, 9, 0) == 25 * 3600


def test_the_time_zone_is_the_users(monkeypatch: pytest.MonkeyPatch) -> None:
    in_berlin = parse_when("14:00", NOW)
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    in_tokyo = parse_when("14:00", NOW)
    assert in_tokyo == at(2026, 12, 2, 14, 0, tz=TOKYO)
    assert in_berlin - in_tokyo == 8 * 3600
    assert iso_local(in_berlin) == "2026-12-02T22:00:00+09:00"
    assert format_when(in_berlin, NOW) == "today 22:00"


@pytest.mark.parametrize(
    "ts, shown",
    [
        (at(2026, 12, 2, 14, 0), "today 14:00"),
        (at(2026, 12, 2, 14, 0, 30), "today 14:00:30"),
        (at(2026, 12, 2, 14, 0) + 0.7, "today 14:00"),  # under a second is not shown
        (at(2026, 12, 2, 0, 0), "today 00:00"),
        (at(2026, 12, 3, 9, 0), "tomorrow 09:00"),
        (at(2026, 12, 3, 9, 0, 5), "tomorrow 09:00:05"),
        (at(2026, 12, 1, 9, 0), "yesterday 09:00"),
        (at(2026, 11, 30, 9, 0), "Mon 30 Nov 09:00"),  # further back: the long form
        (at(2026, 12, 4, 9, 0), "Fri 09:00"),
        (at(2026, 12, 5, 9, 0), "Sat 09:00"),
        (at(2026, 12, 8, 23, 59), "Tue 23:59"),  # six days ahead
        (at(2026, 12, 9, 9, 0), "Wed 9 Dec 09:00"),  # seven: "Wed" would read as today
        (at(2026, 12, 24, 9, 0), "Thu 24 Dec 09:00"),
        (at(2027, 1, 4, 9, 0), "Mon 4 Jan 2027 09:00"),
        (at(2027, 12, 3, 9, 0), "Fri 3 Dec 2027 09:00"),
        (at(2025, 12, 2, 9, 0), "Tue 2 Dec 2025 09:00"),
    ],
)
def test_format_when(ts: float, shown: str) -> None:
    assert format_when(ts, NOW) == shown


def test_format_when_across_the_new_year() -> None:
    now = at(2026, 12, 30, 12, 0)
    assert format_when(at(2027, 1, 1, 9, 0), now) == "Fri 09:00"
    assert format_when(at(2027, 1, 15, 9, 0), now) == "Fri 15 Jan 2027 09:00"


def test_format_when_on_dst_days() -> None:
    now = at(2026, 10, 25, 0, 0)
    assert format_when(at(2026, 10, 25, 2, 30), now) == "today 02:30"
    assert format_when(at(2026, 10, 25, 2, 30, fold=1), now) == "today 02:30"
    assert format_when(at(2026, 3, 29, 3, 30), at(2026, 3, 28, 12, 0)) == "tomorrow 03:30"


def test_iso_local() -> None:
    assert iso_local(at(2026, 12, 3, 9, 0)) == "2026-12-03T09:00:00+01:00"
    assert iso_local(at(2026, 6, 1, 9, 0)) == "2026-06-01T09:00:00+02:00"
    assert iso_local(at(2026, 12, 3, 9, 0, 30) + 0.9) == "2026-12-03T09:00:30+01:00"
    # the doubled hour keeps the offset that tells its two halves apart
    assert iso_local(at(2026, 10, 25, 2, 30)) == "2026-10-25T02:30:00+02:00"
    assert iso_local(at(2026, 10, 25, 2, 30, fold=1)) == "2026-10-25T02:30:00+01:00"


@pytest.mark.parametrize(
    "ts",
    [
        at(2026, 12, 3, 9, 0),
        at(2026, 6, 1, 9, 0, 59),
        at(2027, 1, 1, 0, 0),
        at(2026, 3, 29, 3, 0),
        at(2026, 10, 25, 2, 30),
        at(2026, 10, 25, 2, 30, fold=1),
    ],
)
def test_iso_local_round_trips_through_parse_when(ts: float) -> None:
    assert parse_when(iso_local(ts), NOW) == ts


def test_the_json_shapes_times_read_back() -> None:
    """``reserve --start`` takes a booking's ``end`` from another's --json as it is."""
    for ts in (at(2026, 12, 3, 9, 0), at(2026, 12, 3, 9, 0, 1) + 0.123, NOW + 40.5):
        assert parse_when(model_iso(ts) or "", NOW) == pytest.approx(ts, abs=1e-3)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "   ",
        "25:00",
        "24:00",
        "12:61",
        "12:00:60",
        "9:5",
        "14",
        "1700",
        "13pm",
        "0am",
        "+",
        "+3x",
        "+0s",
        "+400d",
        "-2h",
        "next week",
        "yesterday",
        "noon",
        "today noon",
        "tomorrow 25:00",
        "thu 99:00",
        "thu 9",
        "thu9:00",
        "thursday next",
        "2026-13-01",
        "2026-02-30",
        "2026-12-03T25:00",
        "2026-12-03T09",
        "2026-12-03T09:00+25:00",
        "2026-12-03+01:00",
        "2026-12-03T09:00.5",
        "2026-12-03T09:00:00.1234567",
        "20261203",
        "2026-12-03 09:00 tomorrow",
    ],
)
def test_bad_input_is_a_one_line_usage_error_with_an_example(bad: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_when(bad, NOW)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"not a time: {bad!r} (")
    assert "e.g." in message


def test_bad_input_is_refused_for_an_end_too() -> None:
    with pytest.raises(UsageError):
        parse_when("25:00", NOW, after=NOW)


def test_an_end_weekday_is_the_first_after_the_start() -> None:
    monday_morning = at(2026, 11, 30, 8, 0)
    friday_night = parse_when("fri 22:00", monday_morning)
    assert friday_night == at(2026, 12, 4, 22, 0)
    assert parse_when("mon 09:00", monday_morning, after=friday_night) == at(2026, 12, 7, 9, 0)
