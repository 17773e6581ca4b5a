"""The states a GPU and a job can be in: one table each, used everywhere they are judged.

The values are what ``--json``, the store's job records and the event log hold, so they are
plain strings on the wire; the enums name them in code.
"""

from __future__ import annotations

from enum import Enum
from typing import NoReturn, Optional

from gpuclaim.core.errors import IllegalTransition


class GpuState(str, Enum):
    FREE = "free"
    CLAIMED = "claimed"
    BUSY_UNCLAIMED = "busy-unclaimed"
    STALE = "stale"
    UNREACHABLE = "unreachable"
    RESERVED = "reserved"  # free, inside someone's booking window: theirs alone
    SHARED = "shared"  # held by shares of its memory (--gpu-mem): room for more, never whole

    def __str__(self) -> str:
        return self.value


# Why a job's claim is held with no wrapper beating for it: a service (serve) whose node
# rebooted or went away. Its GPUs stay its own; the next look at the node starts it again.
SERVICE_DOWN = "service down"


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
    PREEMPTED = "preempted"  # a --preemptible job that yielded its GPUs to someone's claim

    def __str__(self) -> str:
        return self.value


class ServiceHealth(str, Enum):
    """How a service (``gpuclaim serve``) is doing; its job's state stays ``running``."""

    STARTING = "starting"  # started (or restarted), no answer yet, within --health-start
    HEALTHY = "healthy"  # its last check answered
    UNHEALTHY = "unhealthy"  # checks failed in a row (fewer than make it restart)
    RESTARTING = "restarting"  # it exited or stopped answering: waiting to start again
    DOWN = "down"  # its node rebooted or cannot be reached: it comes back at the next look

    def __str__(self) -> str:
        return self.value


class FaceState(str, Enum):
    """What a GPU's row shows: its GpuState, or a face only a display has."""

    FREE = "free"
    CLAIMED = "claimed"
    BUSY_UNCLAIMED = "busy-unclaimed"
    STALE = "stale"
    UNREACHABLE = "unreachable"
    RESERVED = "reserved"
    SHARED = "shared"
    DRAINED = "drained"  # free, on a node that takes no new claims
    PROBING = "probing"  # its node has not answered the board's first look yet

    def __str__(self) -> str:
        return self.value


class ReasonCode(str, Enum):
    """Why a queued job has not started (the first word of its reason, as ``squeue`` says)."""

    RESOURCES = "Resources"  # not enough GPUs free where it may run
    PRIORITY = "Priority"  # jobs ahead of it wait for the GPUs it would use
    DEPENDENCY = "Dependency"  # --after: what it waits for has not ended
    USER_LIMIT = "UserLimit"  # max_gpus_per_user
    ARRAY_LIMIT = "ArrayLimit"  # --array ...%K
    RESERVATION = "Reservation"  # the free GPUs are someone else's booking (or its own is shut)
    DRAINED = "Drained"  # the only nodes it may use take no new work
    BEGIN_TIME = "BeginTime"  # run --begin
    UNREACHABLE = "NodeDown"  # the only nodes it may use cannot be reached
    OWNER = "Owner"  # it fits, and only its owner's account may start it (core/accounts.py)

    def __str__(self) -> str:
        return self.value


def unhandled(value: NoReturn) -> NoReturn:
    """The end of an exhaustive ``if state is ...`` chain: mypy fails the build when a member
    has no branch (``typing.assert_never``, which Python 3.9 nodes do not have)."""
    raise AssertionError(f"unhandled state {value!r}")


def job_state(value: str) -> Optional[JobState]:
    """The JobState a stored or wire string names; None for one this version does not know
    (written by a newer gpuclaim): shown as it is, never judged."""
    try:
        return JobState(value)
    except ValueError:
        return None


def face_state(value: str) -> Optional[FaceState]:
    """The FaceState a GPU row's state string names; None for one this version does not know."""
    try:
        return FaceState(value)
    except ValueError:
        return None


# As values (str), so that membership works on what the store and the wire hold.
ACTIVE_JOB_STATES: tuple[str, ...] = tuple(
    s.value for s in (JobState.QUEUED, JobState.STARTING, JobState.RUNNING)
)
FINAL_STATES: tuple[str, ...] = tuple(
    s.value for s in JobState if s.value not in ACTIVE_JOB_STATES
)  # a job's or a rank's end: succeeded, failed, killed, timeout, lost, cancelled
# Started and not ended: its sessions run (or are starting) on its nodes.
STARTED_STATES: tuple[str, ...] = (JobState.STARTING.value, JobState.RUNNING.value)
# The ends other than success, the worst first (an array's row shows the worst of its tasks).
UNSUCCESSFUL_STATES: tuple[str, ...] = tuple(
    s.value
    for s in (
        JobState.FAILED,
        JobState.TIMEOUT,
        JobState.LOST,
        JobState.KILLED,
        JobState.PREEMPTED,
        JobState.CANCELLED,
    )
)
# The ends of a job that never ran (nothing started, no log): never "Started", exit 1.
NEVER_RAN_STATES: tuple[str, ...] = (JobState.CANCELLED.value,)


def started(state: str) -> bool:
    """Is a job (or a rank) in ``state`` on its GPUs now: starting or running."""
    return state in STARTED_STATES


def ended(state: str) -> bool:
    """Has a job (or a rank) in ``state`` ended, however it ended."""
    return state in FINAL_STATES


def ended_badly(state: str) -> bool:
    """Has it ended other than by succeeding (failed, killed, timeout, lost, preempted, never
    ran)."""
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


def face_style(state: FaceState) -> str:
    """How a GPU state is shown (a rich style name), the same in ``status`` and on the board."""
    if state is FaceState.FREE:
        return "green"
    if state is FaceState.CLAIMED:
        return "yellow"
    if state is FaceState.BUSY_UNCLAIMED:
        return "bold red"
    if state is FaceState.STALE:
        return "magenta"
    if state is FaceState.UNREACHABLE:
        return "dim red"
    if state is FaceState.RESERVED:
        return "cyan"  # free, inside someone's booking window
    if state is FaceState.SHARED:
        return "blue"  # held in parts, room for more parts
    if state is FaceState.DRAINED:
        return "dim green"
    if state is FaceState.PROBING:
        return "dim"
    unhandled(state)


def job_style(state: JobState) -> str:
    """How a job state is shown (a rich style name) in ``jobs``, ``show`` and on the board."""
    if state is JobState.RUNNING or state is JobState.STARTING:
        return "green"
    if state is JobState.QUEUED:
        return "yellow"
    if state is JobState.SUCCEEDED:
        return "dim green"
    if state is JobState.FAILED:
        return "red"
    if state is JobState.TIMEOUT:
        return "magenta"
    if state is JobState.KILLED or state is JobState.CANCELLED:
        return "dim"
    if state is JobState.PREEMPTED:
        return "blue"
    if state is JobState.LOST:
        return "bold red"
    unhandled(state)


def style_of_face(value: str) -> str:
    """``face_style`` for a row's state string; no style for a state this version does not know."""
    state = face_state(value)
    return "" if state is None else face_style(state)


def style_of_job(value: str) -> str:
    """``job_style`` for a job's state string; no style for a state this version does not know."""
    state = job_state(value)
    return "" if state is None else job_style(state)
