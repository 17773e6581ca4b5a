"""Points in time as people type them for ``reserve --start/--end``: ``+2h``, ``14:00``,
``5:30pm``, ``tomorrow 09:00``, ``thu 9am``, ``2026-12-03T09:00+01:00``.

Wall-clock forms are in the process's local zone (``TZ``), read at each call: naive
``datetime`` arithmetic on local dates, converted with ``.timestamp()``, so a day step keeps
the wall time across DST and a missing or doubled wall time takes ``fold=0`` instead of
raising. Parsing is pure: a time in the past is returned as is; the caller decides.
"""

from __future__ import annotations

import functools
import re
from datetime import date, datetime, time, timedelta, timezone

from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import UsageError

_EXAMPLES = "use e.g. +2h, 14:00, tomorrow 09:00, thu 09:00 or 2026-12-03T09:00"

_DAY_NAMES = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_FULL_DAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAYS = {
    name.lower(): i for names in (_DAY_NAMES, _FULL_DAY_NAMES) for i, name in enumerate(names)
}
_NEAR_DAYS = {-1: "yesterday", 0: "today", 1: "tomorrow"}


# The patterns are compiled on first use, not at import: every look imports this module
# (engine.bookings), and few parse a time.
@functools.cache
def _clock_re() -> re.Pattern[str]:
    # "14:00", "9:05", "14:00:30", "9am", "5 pm", "5:30pm"; a bare "14" is not a time.
    return re.compile(r"^(\d{1,2})(?::(\d{2})(?::(\d{2}))?)?\s*(am|pm)?$")


@functools.cache
def _iso_re() -> re.Pattern[str]:
    # Only what datetime.fromisoformat reads alike on 3.9 and 3.11+ (3.11 reads much more);
    # fractions too, since the --json shapes (model.iso) write "...T09:00:00.000Z".
    return re.compile(
        r"^(\d{4}-\d{2}-\d{2})"
        r"(?:[t ](\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)(z|[+-]\d{2}:\d{2})?)?$"
    )


def parse_when(text: str, now: float, *, after: float | None = None) -> float:
    """Epoch seconds for ``text``; raises UsageError with an example of what works.

        ``now`` anchors every form. ``after`` (the start, when parsing ``--end``) only moves a bare
        time of day: it becomes the first such time strictly after ``after``, so
        ``--start 22:00 --end 02:00`` ends the next night. Relative forms (``+2h``) always count
        from ``now``, ``today``/``tomorrow`` are dates fixed by ``now``, and a weekday is the next
    one after ``now`` (or after ``after``, when given).
    """
    value = " ".join(text.strip().lower().split())
    if value == "now":
        return now
    if value.startswith("+"):
        return now + _relative(text, value[1:])
    today = datetime.fromtimestamp(now).date()
    word, _, rest = value.partition(" ")
    if word in ("today", "tomorrow") or word in _WEEKDAYS:
        clock = _clock(text, rest) if rest else time(0)
        if clock is None:
            raise _not_a_time(text)
        if word == "today":
            return _local(today, clock)
        if word == "tomorrow":
            return _local(today + timedelta(days=1), clock)
        # an end's weekday is the first one after the start (fri 22:00 -> mon 09:00)
        anchor = now if after is None else max(now, after)
        return _next_weekday(_WEEKDAYS[word], clock, datetime.fromtimestamp(anchor).date(), anchor)
    iso = _iso_re().match(value)
    if iso:
        return _iso(text, *iso.groups())
    clock = _clock(text, value)
    if clock is None:
        raise _not_a_time(text)
    if after is None:
        return _local(today, clock)
    day = datetime.fromtimestamp(after).date()
    candidate = _local(day, clock)
    # Two steps suffice; the third only guards a DST gap that maps the time backwards.
    for _ in range(3):
        if candidate > after:
            break
        day += timedelta(days=1)
        candidate = _local(day, clock)
    return candidate


def format_when(ts: float, now: float) -> str:
    """Short local form: ``today 14:00``, ``tomorrow 09:00``, ``Thu 09:00`` (next 6 days),
    ``Thu 3 Dec 09:00``, ``Fri 3 Dec 2027 09:00``; ``yesterday 14:00``; seconds if non-zero."""
    when = datetime.fromtimestamp(ts)
    today = datetime.fromtimestamp(now).date()
    days = (when.date() - today).days
    clock = f"{when.hour:02d}:{when.minute:02d}" + (f":{when.second:02d}" if when.second else "")
    if days in _NEAR_DAYS:
        day = _NEAR_DAYS[days]
    elif 1 < days < 7:  # a week ahead "Thu" would read as today: from 7 on, the date
        day = _DAY_NAMES[when.weekday()]
    else:
        day = f"{_DAY_NAMES[when.weekday()]} {when.day} {_MONTH_NAMES[when.month - 1]}"
        if when.year != today.year:
            day += f" {when.year}"
    return f"{day} {clock}"


def iso_local(ts: float) -> str:
    """ISO 8601 with the local offset, to the second: ``2026-12-03T09:00:00+01:00``."""
    # From UTC, not from naive local: the doubled hour at DST's end keeps its own offset.
    when = datetime.fromtimestamp(ts, tz=timezone.utc).astimezone()
    return when.isoformat(timespec="seconds")


def _not_a_time(text: str, why: str = _EXAMPLES) -> UsageError:
    return UsageError(f"not a time: {text!r} ({why})")


def _relative(text: str, rest: str) -> float:
    try:
        return parse_duration(rest)  # "" too: parse_duration refuses it
    except UsageError:
        raise _not_a_time(
            text, "after + comes a duration of at most a year: e.g. +90m, +2h, +1h30m, +2d"
        ) from None


def _clock(text: str, value: str) -> time | None:
    """The time of day in ``value``; None if it is not shaped like one, UsageError if it is
    but names no such time (``25:00``, ``12:61``, ``13pm``)."""
    m = _clock_re().match(value)
    if not m:
        return None
    hour_s, minute_s, second_s, half = m.groups()
    if minute_s is None and half is None:
        return None
    hour, minute, second = int(hour_s), int(minute_s or 0), int(second_s or 0)
    if half is not None:
        if not 1 <= hour <= 12:
            raise _not_a_time(text, "with am/pm the hour is 1-12: e.g. 9am or 5:30pm")
        hour = hour % 12 + (12 if half == "pm" else 0)
    if hour > 23 or minute > 59 or second > 59:
        raise _not_a_time(text, "hours are 0-23 and minutes 0-59: e.g. 14:00 or 9:05")
    return time(hour, minute, second)


def _local(day: date, clock: time) -> float:
    # Naive means local; fold=0 picks one side of a DST gap or overlap without raising.
    return datetime.combine(day, clock).timestamp()


def _next_weekday(weekday: int, clock: time, today: date, now: float) -> float:
    """Today if it is that day and the time is still ahead, else the coming one."""
    day = today + timedelta(days=(weekday - today.weekday()) % 7)
    candidate = _local(day, clock)
    if candidate <= now:
        candidate = _local(day + timedelta(days=7), clock)
    return candidate


def _iso(text: str, day: str, clock: str | None, offset: str | None) -> float:
    if clock and "." in clock:  # 3.9/3.10 read only 3 or 6 digits of a fraction
        whole, fraction = clock.split(".")
        clock = f"{whole}.{fraction.ljust(6, '0')}"
    # 3.9/3.10's fromisoformat refuses "Z"; spell it as the offset it means.
    canonical = day + (f"T{clock}" if clock else "") + ("+00:00" if offset == "z" else offset or "")
    try:
        return datetime.fromisoformat(canonical).timestamp()
    except (ValueError, OverflowError, OSError):
        raise _not_a_time(text, "no such date or time: e.g. 2026-12-03T09:00") from None
