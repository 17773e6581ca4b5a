"""The states a GPU and a job can be in: one table each, used everywhere they are judged.

The values are what ``--json``, the store's job records and the event log hold, so they are
plain strings on the wire; the enums name them in code.
"""

from __future__ import annotations

from enum import Enum

from gpuclaim.core.errors import IllegalTransition


class GpuState(str, Enum):
    FREE = "free"
    CLAIMED = "claimed"
    BUSY_UNCLAIMED = "busy-unclaimed"
    STALE = "stale"
    UNREACHABLE = "unreachable"
    RESERVED = "reserved"  # free, inside someone's booking window: theirs alone

    def __str__(self) -> str:
        return self.value


class JobState(str, Enum):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    TIMEOUT = "timeout"
    LOST = "lost"
    CANCELLED = "cancelled"  # never ran: what it waited for (--after) did not succeed

    def __str__(self) -> str:
        return self.value


# As values (str), so that membership works on what the store and the wire hold.
ACTIVE_JOB_STATES: tuple[str, ...] = tuple(
    s.value for s in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
)
FINAL_STATES: tuple[str, ...] = tuple(
    s.value for s in JobState if s.value not in ACTIVE_JOB_STATES
)  # a job's or a rank's end: succeeded, failed, killed, timeout, lost, cancelled
# The ends other than success, the worst first (an array's row shows the worst of its tasks).
UNSUCCESSFUL_STATES: tuple[str, ...] = tuple(
    s.value
    for s in (JobState.FAILED, JobState.TIMEOUT, JobState.LOST, JobState.KILLED, JobState.CANCELLED)
)
# The ends of a job that never ran (nothing started, no log): never "Started", exit 1.
NEVER_RAN_STATES: tuple[str, ...] = (JobState.CANCELLED.value,)


def ended(state: str) -> bool:
    """Has a job (or a rank) in ``state`` ended, however it ended."""
    return state in FINAL_STATES


def ended_badly(state: str) -> bool:
    """Has it ended other than by succeeding (failed, killed, timeout, lost, never ran)."""
    return state in UNSUCCESSFUL_STATES


def never_ran(state: str) -> bool:
    """Did it end without ever running (what it waited for with --after did not succeed)."""
    return state in NEVER_RAN_STATES


# Which job state may follow which: every change of a job's (or a rank's) state in the store
# goes through ``check_transition``. An end is final: nothing follows it but itself. A job
# that never ran (cancelled) can only come from the queue; one that ran never becomes it.
_ENDS_OF_A_RUN = frozenset(FINAL_STATES) - frozenset(NEVER_RAN_STATES)
JOB_TRANSITIONS: dict[str, frozenset[str]] = {
    JobState.QUEUED.value: frozenset({JobState.STARTING.value, JobState.RUNNING.value})
    | frozenset(FINAL_STATES),
    JobState.STARTING.value: frozenset({JobState.RUNNING.value}) | _ENDS_OF_A_RUN,
    JobState.RUNNING.value: _ENDS_OF_A_RUN,
    **{end: frozenset() for end in FINAL_STATES},
}


def may_follow(old: str, new: str) -> bool:
    """Whether a job (or rank) in ``old`` may change to ``new`` (staying is always allowed;
    a state the table does not know, from an older or newer gpuclaim, is not judged)."""
    return old == new or old not in JOB_TRANSITIONS or new in JOB_TRANSITIONS[old]


def check_transition(old: str, new: str, what: str) -> None:
    """Raise IllegalTransition naming both states when ``new`` may not follow ``old``."""
    if not may_follow(old, new):
        raise IllegalTransition(f"{what}: {new!r} may not follow {old!r}")


# How each GPU state is shown (rich style names), the same in ``status`` and on the board.
STATE_STYLE: dict[str, str] = {
    GpuState.FREE.value: "green",
    GpuState.CLAIMED.value: "yellow",
    GpuState.BUSY_UNCLAIMED.value: "bold red",
    GpuState.STALE.value: "magenta",
    GpuState.UNREACHABLE.value: "dim red",
    GpuState.RESERVED.value: "cyan",
}
