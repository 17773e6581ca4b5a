"""The store's plain records, typed: what a file on the storage holds, as a ``TypedDict``, so
mypy checks every key read while the values stay the dicts read from JSON (no runtime cost,
nothing to convert). Standard library only: the node side reads them too."""

from __future__ import annotations

from typing import TypedDict


class Drain(TypedDict, total=False):
    """``drain/<node>``: who drained the node, why, since when (storage clock). An unreadable
    mark reads as user ``?`` with no ``since``."""

    user: str
    reason: str
    since: float
