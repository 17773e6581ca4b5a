"""Job arrays and sweeps as users write them: SLURM's ``--array`` syntax and sweep files.

``0-95``, ``1,3,5-7``, ``0-10:2``, each with an optional ``%K`` (at most K tasks at once); a
sweep file is one task per line, the line's words split as a POSIX shell splits them
(quotes respected, nothing expanded), blank lines and ``#`` comments skipped.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from typing import Optional

from gpuclaim.core.errors import UsageError

ARRAY_ID_PREFIX = "a-"  # array ids: 'a-<hex>'; their tasks: 'a-<hex>-<index>'
MAX_TASKS = 10_000  # SLURM's default MaxArraySize is 1001; a sweep of 10,000 is still sane


# The patterns are compiled on first use, not at import: the queue's order imports this module.
@functools.cache
def _range() -> re.Pattern[str]:
    return re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


@functools.cache
def _task_name() -> re.Pattern[str]:
    return re.compile(r"^(.+)\[(\d+)\]$")


@dataclass(frozen=True)
class ArraySpec:
    """``--array``'s indices, and how many of its tasks may run at once (``%K``)."""

    indices: tuple[int, ...]
    max_running: Optional[int] = None

    def text(self) -> str:
        """The indices as SLURM's compact syntax again (``0-95``, ``1,3,5-7``)."""
        return compact(self.indices) + (f"%{self.max_running}" if self.max_running else "")


def parse_array_spec(spec: str) -> ArraySpec:
    """``0-95%8`` -> indices 0..95, at most 8 at once. A malformed spec is one UsageError."""
    text = spec.strip()
    body, pct, limit = text.partition("%")
    max_running: Optional[int] = None
    if pct:
        if not limit.isdigit() or int(limit) < 1:
            raise UsageError(f"--array {spec!r}: %K wants a whole number >= 1 after the %")
        max_running = int(limit)
    if not body:
        raise UsageError(f"--array {spec!r}: give indices, e.g. 0-95, 1,3,5-7 or 0-10:2")
    indices: set[int] = set()
    for part in body.split(","):
        match = _range().match(part.strip())
        if not match:
            raise UsageError(
                f"--array {spec!r}: {part!r} is not an index or a range (e.g. 0-95, 0-10:2)"
            )
        first, last, step = match.group(1), match.group(2), match.group(3)
        start = int(first)
        end = int(last) if last is not None else start
        stride = int(step) if step is not None else 1
        if end < start:
            raise UsageError(f"--array {spec!r}: the range {part!r} ends before it starts")
        if stride < 1:
            raise UsageError(f"--array {spec!r}: the step in {part!r} must be at least 1")
        if (end - start) // stride + 1 + len(indices) > MAX_TASKS:
            raise UsageError(f"--array {spec!r}: more than {MAX_TASKS} tasks")
        indices.update(range(start, end + 1, stride))
    return ArraySpec(tuple(sorted(indices)), max_running)


def parse_sweep(text: str, source: str) -> list[tuple[str, ...]]:
    """The tasks of a sweep file: each line's words, in order. ``source`` names the file in
    errors ('sweep.txt line 3: No closing quotation')."""
    tasks: list[tuple[str, ...]] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            words = shlex.split(stripped, comments=False, posix=True)
        except ValueError as exc:
            raise UsageError(f"{source} line {number}: {exc}") from None
        tasks.append(tuple(words))
        if len(tasks) > MAX_TASKS:
            raise UsageError(f"{source}: more than {MAX_TASKS} tasks")
    if not tasks:
        raise UsageError(f"{source} has no tasks: one line per task, '#' lines are comments")
    return tasks


def task_name(base: str, index: int) -> str:
    return f"{base}[{index}]"


def split_task_name(name: str) -> Optional[tuple[str, int]]:
    """``sweep[7]`` -> ("sweep", 7); anything else None."""
    match = _task_name().match(name)
    return (match.group(1), int(match.group(2))) if match else None


def compact(indices: tuple[int, ...]) -> str:
    """Sorted indices as ranges: (0, 1, 2, 5, 7, 8) -> '0-2,5,7-8'."""
    parts: list[str] = []
    run_start: Optional[int] = None
    previous: Optional[int] = None
    for i in sorted(indices):
        if previous is not None and i == previous + 1:
            previous = i
            continue
        if run_start is not None and previous is not None:
            parts.append(str(run_start) if run_start == previous else f"{run_start}-{previous}")
        run_start = previous = i
    if run_start is not None and previous is not None:
        parts.append(str(run_start) if run_start == previous else f"{run_start}-{previous}")
    return ",".join(parts)
