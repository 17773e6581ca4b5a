"""How values are spelled in SLURM's files: compressed host lists (``node[01-03]``), number
ranges, nodes sharing one line, the ClusterName, a single word for a configuration value
and a text made safe for a one-line ``#`` comment. Pure string helpers used by every
renderer in this package.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpuclaim.core.errors import UsageError


def ranges(numbers: Sequence[int], width: int = 0) -> str:
    """[0, 1, 2, 5] -> ``0-2,5`` (zero-padded to ``width``)."""
    out, run = [], [numbers[0]]
    for x in numbers[1:]:
        if x == run[-1] + 1:
            run.append(x)
        else:
            out.append(run)
            run = [x]
    out.append(run)
    fmt = f"{{:0{width}d}}"
    return ",".join(
        fmt.format(r[0]) if len(r) == 1 else f"{fmt.format(r[0])}-{fmt.format(r[-1])}" for r in out
    )


def hostlist(names: list[str]) -> str:
    """SLURM's compressed host list: node01, node02, node03, gpu -> ``gpu,node[01-03]``."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain = []
    for name in names:
        m = re.match(r"^(.*?)(\d+)$", name)
        if m:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
        else:
            plain.append(name)
    parts = list(plain)
    for (prefix, width), numbers in groups.items():
        numbers = sorted(set(numbers))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
        else:
            parts.append(f"{prefix}[{ranges(numbers, width)}]")
    return ",".join(sorted(parts))


def compress(entries: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Nodes whose lines are the same apart from the name share one line, ``node[01-04]``,
    in the order each line first appears."""
    merged: dict[str, list[str]] = {}
    for name, line in entries:
        merged.setdefault(line, []).append(name)
    return [(hostlist(names), line) for line, names in merged.items()]


def cluster_name(name: str) -> str:
    """ClusterName: SLURM lowercases it, and sacctmgr wants it plain."""
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "cluster"


def conf_word(value: str) -> str:
    """``value`` as one word of slurm.conf; UsageError where it cannot be one."""
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", value):
        raise UsageError(f"{value!r} cannot be used in slurm.conf (letters, digits, '.', '_', '-')")
    return value


def comment(text: str) -> str:
    """``text`` on one line, at most 200 characters: safe inside a ``#`` comment."""
    return " ".join(str(text).split())[:200]
