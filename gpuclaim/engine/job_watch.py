"""Watching a job end from outside: its first moment after ``run``, and the exit code and the
one line ``run --follow`` and ``logs -f`` end with (README, "Exit codes")."""

from __future__ import annotations

import time
from typing import Optional

from gpuclaim.core.durations import format_duration
from gpuclaim.core.model import Job, JobRank
from gpuclaim.core.states import JobState, ended, ended_badly, job_state, unhandled
from gpuclaim.engine.job_records import reload_job
from gpuclaim.store import Store

# What `run --follow` and `logs -f` exit with for a job that did not end by its own exit
# (README, "Exit codes"); a job that exits on its own gives its own code.
KILLED_EXIT = 128 + 15  # stopped (kill, the idle policy): as a shell says SIGTERM


TIMEOUT_EXIT = 124  # past its --time, as timeout(1) says it


LOST_EXIT = 255  # its node, tmux or wrapper went away: how it ended is unknown


PREEMPTED_EXIT = 75  # yielded its GPUs (run --preemptible): EX_TEMPFAIL, "try again later"
NEVER_RAN_EXIT = 1  # it never started (cancelled: what it waited for did not succeed)


NO_END_EXIT = 1  # not ended (or in a state this version does not know): no code of its own


# `run` watches a job's first moment, so that one that dies at once is not "Started":
SETTLE_S = 0.5  # running this long on every rank: past its first moment


FIRST_MOMENT_S = 2.0  # never waits longer than this (a node slow to start it)


def watch_first_moment(
    store: Store,
    job: Job,
    settle_s: float = SETTLE_S,
    bound_s: float = FIRST_MOMENT_S,
    poll_s: float = 0.1,
) -> Job:
    """The job once it is past its first moment: ended (a missing file, a bad argument, a
    missing workdir), or running on every rank for ``settle_s``, or as it is after ``bound_s``
    (a node slow to start it). Only reads its record."""
    deadline = time.monotonic() + bound_s
    running_since: Optional[float] = None
    while True:
        job = reload_job(store, job)
        now = time.monotonic()
        # A one-node job's end is recorded as the rank's, then the job's (with its reason):
        # wait for the job's. A gang's failed rank is news at once (its others still stop).
        if ended(job.state) or (len(job.ranks) > 1 and first_bad_rank(job)):
            return job
        if job.ranks and all(r.state == JobState.RUNNING for r in job.ranks):
            running_since = running_since or now
            if now - running_since >= settle_s:
                return job
        if now >= deadline:
            return job
        time.sleep(poll_s)


def first_bad_rank(job: Job) -> Optional[JobRank]:
    """A rank that ended other than well (a gang job may still be stopping its others)."""
    return next((r for r in job.ranks if ended_badly(r.state)), None)


def ended_badly_at_once(job: Job) -> bool:
    """Did the job (or one of its ranks) end other than well: never "Started"."""
    return ended_badly(job.state) or first_bad_rank(job) is not None


def exit_code_of(job: Job) -> int:
    """What `run --follow` and `logs -f` exit with: the job's own exit code when it ended by
    itself, else the documented code of how it ended."""
    state = job_state(job.state)
    return NO_END_EXIT if state is None else exit_code(state, job.exit_code)


def exit_code(state: JobState, own: Optional[int]) -> int:
    """The exit code of a job in ``state`` whose own exit code is ``own`` (README, "Exit
    codes"): its own when it ended by itself, else the documented code of how it ended."""
    if state is JobState.SUCCEEDED:
        return 0
    if state is JobState.FAILED:
        return own or 1  # no code: it never ran (a missing workdir, GPUs gone)
    if state is JobState.KILLED:
        return KILLED_EXIT
    if state is JobState.TIMEOUT:
        return TIMEOUT_EXIT
    if state is JobState.LOST:
        return LOST_EXIT
    if state is JobState.CANCELLED:
        return NEVER_RAN_EXIT
    if state is JobState.PREEMPTED:
        return PREEMPTED_EXIT
    if state is JobState.QUEUED or state is JobState.STARTING or state is JobState.RUNNING:
        return NO_END_EXIT
    unhandled(state)


def never_ran_line(job: Job) -> str:
    """``job train never ran: prep failed``: a job that ended before it ever started."""
    why = job.reason or f"it was {job.state}"
    return (
        f"job {job.name} {why}"
        if why.startswith("never ran")
        else f"job {job.name} never ran: {why}"
    )


def outcome_line(job: Job, now: float) -> str:
    """One line of how a job ended, with the exit code ``exit_code_of`` gives, for scripts:
    ``job train-1a2b failed (exit code 3) after 12s``."""
    code = exit_code_of(job)
    took = format_duration(max(0.0, (job.ended or now) - (job.started or job.submitted)))
    state = job_state(job.state)
    if state is None:  # a newer gpuclaim's state: said as it is
        return f"job {job.name} was {job.state} (exit code {code}) after {took}"
    return _outcome(job, state, code, took)


def _outcome(job: Job, state: JobState, code: int, took: str) -> str:
    if state is JobState.CANCELLED:  # it never ran: no time to tell
        return f"{never_ran_line(job)} (exit code {code})"
    if state is JobState.SUCCEEDED:
        return f"job {job.name} succeeded after {took}"
    if state is JobState.FAILED:
        why = f"{job.reason}; " if job.exit_code is None and job.reason else ""
        return f"job {job.name} failed ({why}exit code {code}) after {took}"
    if state is JobState.TIMEOUT:
        limit = format_duration(job.time_limit_s)
        return f"job {job.name} reached its time limit of {limit} (exit code {code}) after {took}"
    if state is JobState.PREEMPTED:
        why = f" ({job.reason})" if job.reason else ""
        return f"job {job.name} was preempted{why} (exit code {code}) after {took}"
    if state is JobState.LOST:
        return (
            f"job {job.name} was lost: its node, tmux or wrapper went away "
            f"(exit code {code}) after {took}"
        )
    if (
        state is JobState.KILLED
        or state is JobState.QUEUED
        or state is JobState.STARTING
        or state is JobState.RUNNING
    ):
        return f"job {job.name} was {state} (exit code {code}) after {took}"
    unhandled(state)
