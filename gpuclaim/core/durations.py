"""Durations as people and SLURM write them: ``90m``, ``4h``, ``2d``, ``1h30m``, ``1-12:00:00``;
sizes as rsync reads them (``500M``, ``4GiB``, ``2GB``)."""

from __future__ import annotations

import functools
import math
import re

from gpuclaim.core.errors import UsageError

MAX_DURATION_S = 366 * 86400  # the longest duration anything takes: a year
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


# The patterns are compiled on first use, not at import: most calls parse no duration.
@functools.cache
def _human() -> re.Pattern[str]:
    return re.compile(r"^(?:(\d+(?:\.\d+)?)\s*([smhdw]))+$")


@functools.cache
def _human_part() -> re.Pattern[str]:
    return re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


@functools.cache
def _slurm() -> re.Pattern[str]:
    # SLURM --time: "M", "M:S", "H:M:S", "D-H", "D-H:M", "D-H:M:S".
    return re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


_EXAMPLES = "use e.g. 90m, 4h, 2d, 1h30m or SLURM's 1-12:00:00"


def parse_duration(text: str) -> float:
    """Seconds in ``text``; raises UsageError with an example of what works."""
    value = text.strip().lower()
    if not value:
        raise UsageError(f"empty duration ({_EXAMPLES})")
    if _human().match(value):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _human_part().findall(value))
    else:
        seconds = _parse_slurm(value)
    if seconds <= 0:
        raise UsageError(f"duration must be positive: {text!r} ({_EXAMPLES})")
    if seconds > MAX_DURATION_S:
        raise UsageError(f"duration too long: {text!r} (at most a year)")
    return seconds


def duration_setting(value: str | int | float) -> float:
    """Seconds in a duration a config file gives: a string as ``parse_duration`` reads it,
    or a bare number of minutes, as SLURM reads one (0 kept: where a setting says what 0
    means, e.g. gpu_read_max_age's "never"; TOML also writes inf and nan)."""
    if isinstance(value, str):
        return parse_duration(value)
    minutes = float(value)
    if not math.isfinite(minutes) or minutes < 0:
        raise UsageError(f"not a duration: {value} ({_EXAMPLES}; a bare number is minutes)")
    if minutes * 60 > MAX_DURATION_S:
        raise UsageError(f"duration too long: {value} minutes (at most a year)")
    return minutes * 60


def _parse_slurm(value: str) -> float:
    m = _slurm().match(value)
    if not m:
        raise UsageError(f"not a duration: {value!r} ({_EXAMPLES})")
    days, a, b, c = m.groups()
    if days is not None:
        # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = int(a), int(b or 0), int(c or 0)
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if c is not None:  # H:M:S
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:  # M:S
        return int(a) * 60 + int(b)
    return int(a) * 60  # bare number = minutes, as in SLURM


def format_duration(seconds: float) -> str:
    """Short human form: ``3h12m``, ``45m``, ``2d4h``, ``30s``; negative means overdue."""
    sign = "-" if seconds < 0 else ""
    s = int(abs(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        text = f"{days}d{hours}h" if hours else f"{days}d"
    elif hours:
        text = f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    elif minutes:
        text = f"{minutes}m"
    else:
        text = f"{s}s"
    return sign + text


def format_slurm_time(seconds: float) -> str:
    """SLURM's ``D-HH:MM:SS`` (rounded up to the minute), for sbatch export."""
    total = int(-(-seconds // 60)) * 60
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    return f"{days}-{hours:02d}:{minutes:02d}:00" if days else f"{hours:02d}:{minutes:02d}:00"


@functools.cache
def _size() -> re.Pattern[str]:
    return re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Bytes in ``text``, as rsync reads sizes: ``4G``/``4GiB`` = 4 x 1024^3, ``4GB`` = 4 x
    1000^3, ``500M``, ``2T``, a bare number = bytes. Raises UsageError with an example."""
    m = _size().match(text)
    if not m or m.group(3).lower() == "i" or (m.group(3).lower() == "ib" and not m.group(2)):
        raise UsageError(f"not a size: {text!r} (use e.g. 500M, 4GiB, 2GB or 1T)")
    number, unit, suffix = float(m.group(1)), m.group(2).lower(), m.group(3).lower()
    power = " kmgt".index(unit) if unit else 0
    base = 1000 if suffix == "b" else 1024
    return int(number * base**power)


def format_bytes(n: float) -> str:
    """``1.3 GiB``, ``812 MiB``, ``4 KiB``, ``12 B``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"
    return f"{int(n)} B"
