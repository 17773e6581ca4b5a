"""Points in time as users type them (``reserve --start/--end``), in their own time zone."""

from __future__ import annotations

import datetime as dt
import time
from zoneinfo import ZoneInfo

import pytest

from gpuclaim.core.errors import UsageError
from gpuclaim.core.when import format_when, iso_local, parse_when

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(autouse=True)
def berlin(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def at(*parts: int) -> float:
    return dt.datetime(*parts, tzinfo=BERLIN).timestamp()


NOW = at(2026, 12, 2, 15, 30)  # a Wednesday


@pytest.mark.parametrize(
    "text, expected",
    [
        ("now", NOW),
        ("+90s", NOW + 90),
        ("+2h", NOW + 7200),
        ("+1h30m", NOW + 5400),
        ("16:00", at(2026, 12, 2, 16, 0)),
        ("9:05", at(2026, 12, 2, 9, 5)),  # passed: returned as is, the caller refuses it
        ("16:00:30", at(2026, 12, 2, 16, 0, 30)),
        ("5pm", at(2026, 12, 2, 17, 0)),
        ("5:30PM", at(2026, 12, 2, 17, 30)),
        ("12am", at(2026, 12, 2, 0, 0)),
        ("today 17:00", at(2026, 12, 2, 17, 0)),
        ("tomorrow 09:00", at(2026, 12, 3, 9, 0)),
        ("tomorrow", at(2026, 12, 3, 0, 0)),
        ("thu 09:00", at(2026, 12, 3, 9, 0)),
        ("Thursday 9am", at(2026, 12, 3, 9, 0)),
        ("wed 16:00", at(2026, 12, 2, 16, 0)),  # today, still ahead
        ("wed 09:00", at(2026, 12, 9, 9, 0)),  # today but passed: next week
        ("mon", at(2026, 12, 7, 0, 0)),
        ("2026-12-03", at(2026, 12, 3, 0, 0)),
        ("2026-12-03T09:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03 09:00:00", at(2026, 12, 3, 9, 0)),
        ("2026-12-03T08:00:00Z", at(2026, 12, 3, 9, 0)),
        ("2026-12-03T10:00+02:00", at(2026, 12, 3, 9, 0)),
        ("  Tomorrow   09:00 ", at(2026, 12, 3, 9, 0)),
    ],
)
def test_every_form(text, expected):
    assert parse_when(text, NOW) == pytest.approx(expected)


def test_an_end_is_the_first_such_time_after_the_start():
    start = at(2026, 12, 2, 22, 0)
    assert parse_when("02:00", NOW, after=start) == at(2026, 12, 3, 2, 0)
    assert parse_when("23:00", NOW, after=start) == at(2026, 12, 2, 23, 0)
    assert parse_when("+1h", NOW, after=start) == NOW + 3600  # relative is from now


def test_dst_gaps_and_folds_do_not_raise():
    spring = at(2026, 3, 28, 12, 0)
    autumn = at(2026, 10, 24, 12, 0)
    assert parse_when("tomorrow 02:30", spring) > spring
    assert parse_when("tomorrow 02:30", autumn) > autumn


def test_the_time_zone_is_the_users(monkeypatch):
    berlin = parse_when("14:00", NOW)
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    assert berlin - parse_when("14:00", NOW) != 0


@pytest.mark.parametrize(
    "ts, shown",
    [
        (at(2026, 12, 2, 14, 0), "today 14:00"),
        (at(2026, 12, 2, 14, 0, 30), "today 14:00:30"),
        (at(2026, 12, 3, 9, 0), "tomorrow 09:00"),
        (at(2026, 12, 1, 9, 0), "yesterday 09:00"),
        (at(2026, 12, 5, 9, 0), "Sat 09:00"),
        (at(2026, 12, 24, 9, 0), "Thu 24 Dec 09:00"),
        (at(2027, 1, 4, 9, 0), "Mon 4 Jan 2027 09:00"),
    ],
)
def test_format_when(ts, shown):
    assert format_when(ts, NOW) == shown


def test_iso_local_round_trips():
    ts = at(2026, 12, 3, 9, 0)
    assert iso_local(ts) == "2026-12-03T09:00:00+01:00"
    assert parse_when(iso_local(ts), NOW) == ts


@pytest.mark.parametrize(
    "bad",
    ["", "25:00", "12:61", "+", "+3x", "next week", "thu 99:00", "2026-13-01", "14", "13pm"],
)
def test_bad_input_is_one_line(bad):
    with pytest.raises(UsageError) as caught:
        parse_when(bad, NOW)
    assert "\n" not in str(caught.value)
