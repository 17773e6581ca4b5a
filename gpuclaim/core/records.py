"""The store's plain records, typed: what a file on the storage holds, as a ``TypedDict``, so
mypy checks every key read while the values stay the dicts read from JSON (no runtime cost,
nothing to convert). Standard library only: the node side reads them too."""

from __future__ import annotations

from typing import Any, Optional, TypedDict


class Drain(TypedDict, total=False):
    """``drain/<node>``: who drained the node, why, since when (storage clock). An unreadable
    mark reads as user ``?`` with no ``since``."""

    user: str
    reason: str
    since: float


class _ArrayKeys(TypedDict):
    """What every array record holds (and what callers index without ``.get``)."""

    id: str  # 'a-<hex>'; its tasks are 'a-<hex>-<index>'
    name: str
    user: str


class ArrayChanges(TypedDict, total=False):
    """What ``update_array`` may change in a record: its summary, once its last task ended."""

    # counts by state, the indices that did not succeed, GPU-hours, the span, and the flag
    # that every task succeeded. Its key is the state word "succeeded" (ALL_SUCCEEDED in
    # engine/array_records.py), and state words are spelt in core/states.py only, which a
    # TypedDict cannot take a key from: so a plain dict, not a TypedDict of its own.
    result: Optional[dict[str, Any]]


class ArrayRecord(_ArrayKeys, ArrayChanges, total=False):
    """``jobs/<id>.array``: a job array as ``run --array``/``--sweep`` made it; ``result``
    is absent (or None) until the array ended."""

    spec: str  # as the user gave it: '0-95%8', or the sweep file's name
    indices: list[int]
    count: int
    max_running: Optional[int]
    argv: list[str]
    sweep: bool
    submitted: float  # storage clock
    after: list[dict[str, Any]]  # Dependency.to_dict() of each --after/--after-any


class UsageSample(TypedDict):
    """One look at a claim's GPUs for ``record_usage``: when the claim began, and each GPU's
    utilisation in percent (None: not measurable, as under MIG)."""

    since: float
    utils: list[Optional[int]]


class UsageSummary(TypedDict, total=False):
    """``usage/<claim>.json``: a claim's rolling usage, folded one sample at a time by
    ``core.usage.fold_sample`` (storage clock). Every key is there once one sample was folded;
    a file read back is taken as it is."""

    since: float  # the claim's start
    last: float  # the last sample
    samples: int
    gpus: int
    held_gpu_s: float  # GPU-seconds sampled
    busy_gpu_s: float  # of which busy (utilisation-weighted)
    mean_pct: float  # over about the last hour
    max_pct: float
    last_active: float  # when a GPU of the claim was last over the threshold
