"""Which queued job goes next: the queue entry's name (what a dispatch pass sorts by without
reading a job record), the decayed use of a user's GPU-seconds, and the priority formula.

    priority = fairshare_weight * 2 ** (-use / mean use)
             + age_weight * min(1, waited / max_age)
             - nice

``use`` is the user's GPU-seconds, each one counted less the longer ago it was (halved every
``half_life``), running work included; ``mean use`` is the mean over the users with use or
queued jobs. A user who used nothing gets the whole fair-share weight; one at the mean, half.
Standard library only: wrappers and keepers dispatch from the nodes."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Optional

from gpuclaim.core.arrays import ARRAY_ID_PREFIX
from gpuclaim.core.config import QueuePolicy

MAX_NICE = 100000


@functools.cache  # compiled on first use: a run imports this module for MAX_NICE alone
def _entry() -> re.Pattern[str]:
    return re.compile(
        r"^(?P<time>\d+\.\d+)-(?P<job>[A-Za-z0-9_-]+?)"
        r"(?:\+(?P<user>[A-Za-z0-9][A-Za-z0-9_-]*)\+(?P<nice>\d+)\+(?P<begin>\d+))?$"
    )


@dataclass(frozen=True)
class QueueEntry:
    """One entry of the queue directory, as its name says. Entries written before fair share
    (``TIME-JOBID``) carry no user: the pass reads their record for it."""

    name: str
    job_id: str
    submitted: float
    user: Optional[str] = None
    nice: int = 0
    begin: float = 0.0  # 0: no --begin

    @property
    def order(self) -> tuple[float, str, int]:
        """Submission order; an array's tasks by index (``a-1f2e-10`` after ``a-1f2e-9``)."""
        group, _, index = self.job_id.rpartition("-")
        if self.job_id.startswith(ARRAY_ID_PREFIX) and index.isdigit():
            return (self.submitted, group, int(index))
        return (self.submitted, self.job_id, 0)


def entry_name(submitted: float, job_id: str, user: str, nice: int, begin: float) -> str:
    return f"{submitted:017.6f}-{job_id}+{user}+{nice}+{math.ceil(begin)}"


@functools.lru_cache(
    maxsize=65536
)  # a look parses the queue up to three times (pass, list, keepers)
def parse_entry(name: str) -> Optional[QueueEntry]:
    """The entry a file name in the queue directory is; None for a name that is none (its
    entries are frozen: one parsed once is shared)."""
    m = _entry().match(name)
    if m is None:
        return None
    return QueueEntry(
        name=name,
        job_id=m.group("job"),
        submitted=float(m.group("time")),
        user=m.group("user"),
        nice=int(m.group("nice") or 0),
        begin=float(m.group("begin") or 0),
    )


def decay(value: float, elapsed_s: float, half_life_s: float) -> float:
    """``value`` counted ``elapsed_s`` later."""
    return value * math.pow(2.0, -max(0.0, elapsed_s) / half_life_s)


def decayed_gpu_seconds(
    gpus: float, start: float, end: float, now: float, half_life_s: float
) -> float:
    """``gpus`` GPUs held from ``start`` to ``end``, each second counted as of ``now``: the
    integral of 2^(-(now - t) / half_life) over the hold."""
    end = min(end, now)
    if end <= start:
        return 0.0
    scale = half_life_s / math.log(2)
    return (
        gpus
        * scale
        * (math.pow(2.0, -(now - end) / half_life_s) - math.pow(2.0, -(now - start) / half_life_s))
    )


def share_factor(use: float, mean_use: float) -> float:
    """1 for no use, 0.5 at the mean, 0.25 at twice the mean (SLURM's 2^(-U/S) with equal
    shares)."""
    if mean_use <= 0:
        return 1.0
    return math.pow(2.0, -use / mean_use)


def mean_use(uses: dict[str, float], users: set[str]) -> float:
    """The mean over ``users`` (those queuing) and everyone with recorded use."""
    everyone = users | {u for u, v in uses.items() if v > 0}
    if not everyone:
        return 0.0
    return sum(uses.get(u, 0.0) for u in everyone) / len(everyone)


@dataclass(frozen=True)
class Priority:
    """A queued job's priority and its parts (``jobs --explain`` shows them)."""

    value: float
    fairshare: float  # the fair-share points
    age: float  # the waiting points
    nice: int
    use_gpu_hours: float  # the user's decayed use, in GPU-hours
    mean_use_gpu_hours: float  # ... and the mean it is compared with


def priority(policy: QueuePolicy, use: float, mean: float, waited_s: float, nice: int) -> Priority:
    fair = policy.fairshare_weight * share_factor(use, mean)
    age = policy.age_weight * min(1.0, max(0.0, waited_s) / policy.max_age_s)
    return Priority(fair + age - nice, fair, age, nice, use / 3600.0, mean / 3600.0)
