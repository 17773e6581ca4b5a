"""Points in time as people type them for a booking: ``+2h``, ``14:00``, ``tomorrow 09:00``,
``thu 9am``, ISO 8601; in the user's own time zone (``TZ``), and shown back in it."""

from __future__ import annotations

import datetime as dt
import re
from typing import Optional

from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import UsageError

_EXAMPLES = "use e.g. +2h, 14:00, tomorrow 09:00, thu 09:00 or 2026-12-03T09:00"
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_FULL_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_CLOCK = re.compile(r"^(\d{1,2})(?::(\d{2}))?(?::(\d{2}))?\s*(am|pm)?$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}")


def parse_when(text: str, now: float, *, after: Optional[float] = None) -> float:
    """Epoch seconds for ``text``. A relative form counts from ``now``. A bare time of day is
    today's, or with ``after`` (an end) the first one after it; a time that has passed today
    is returned as it is (the caller refuses a start in the past, saying so)."""
    value = " ".join(text.strip().lower().split())
    if not value:
        raise UsageError(f"empty time ({_EXAMPLES})")
    if value == "now":
        return now
    if value.startswith("+"):
        try:
            return now + parse_duration(value[1:])
        except UsageError:
            raise UsageError(f"not a time: {text!r} ({_EXAMPLES})") from None
    if _ISO_DATE.match(value):
        return _iso(text.strip())
    today = dt.datetime.fromtimestamp(now).astimezone().date()
    head, _, rest = value.partition(" ")
    if head in ("today", "tomorrow"):
        day = today + dt.timedelta(days=1 if head == "tomorrow" else 0)
        return _at(day, rest or "00:00", text)
    if head in _DAYS or head in _FULL_DAYS:
        weekday = (_DAYS if head in _DAYS else _FULL_DAYS).index(head)
        ahead = (weekday - today.weekday()) % 7
        when = _at(today + dt.timedelta(days=ahead), rest or "00:00", text)
        return when if when > now else _at(today + dt.timedelta(days=ahead or 7), rest, text)
    when = _at(today, value, text)
    if after is not None:
        day = today
        while when <= after:  # an end at 02:00 after a start at 22:00 is the next night's
            day += dt.timedelta(days=1)
            when = _at(day, value, text)
    return when


def _at(day: dt.date, clock: str, text: str) -> float:
    m = _CLOCK.match(clock.strip() or "00:00")
    if not m:
        raise UsageError(f"not a time: {text!r} ({_EXAMPLES})")
    hour, minute, second = int(m.group(1)), int(m.group(2) or 0), int(m.group(3) or 0)
    if m.group(4):
        if not 1 <= hour <= 12:
            raise UsageError(f"not a time: {text!r} (am/pm hours go from 1 to 12)")
        hour = hour % 12 + (12 if m.group(4) == "pm" else 0)
    elif m.group(2) is None:
        raise UsageError(f"not a time: {text!r} ({_EXAMPLES})")  # a bare "14" is ambiguous
    if hour > 23 or minute > 59 or second > 59:
        raise UsageError(f"not a time: {text!r} (hours 0-23, minutes and seconds 0-59)")
    local = dt.datetime(day.year, day.month, day.day, hour, minute, second)
    return local.astimezone().timestamp()  # naive = local; a DST gap or fold picks fold=0


def _iso(raw: str) -> float:
    value = raw.replace(" ", "T", 1)
    if value.endswith(("Z", "z")):
        value = value[:-1] + "+00:00"  # Python before 3.11 does not read a Z
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"not a time: {raw!r} ({_EXAMPLES})") from None
    if when.tzinfo is None:
        when = when.astimezone()  # no offset: the user's own zone
    return when.timestamp()


def format_when(ts: float, now: float) -> str:
    """``today 14:00``, ``tomorrow 09:00``, ``Thu 09:00`` (this week), ``Thu 3 Dec 09:00``."""
    when = dt.datetime.fromtimestamp(ts).astimezone()
    today = dt.datetime.fromtimestamp(now).astimezone().date()
    clock = when.strftime("%H:%M:%S" if when.second else "%H:%M")
    days = (when.date() - today).days
    if days == 0:
        return f"today {clock}"
    if days == 1:
        return f"tomorrow {clock}"
    if days == -1:
        return f"yesterday {clock}"
    if 1 < days <= 6:
        return f"{when.strftime('%a')} {clock}"
    year = "" if when.year == today.year else f" {when.year}"
    return f"{when.strftime('%a')} {when.day} {when.strftime('%b')}{year} {clock}"


def iso_local(ts: float) -> str:
    """ISO 8601 with the local offset: ``2026-12-03T09:00:00+01:00``."""
    return dt.datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
