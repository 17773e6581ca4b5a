"""The one table of job states (core/states.py): every state is active or final, and the
questions "has it ended, and how" agree with it."""

from __future__ import annotations

import pytest

from gpuclaim.core import states
from gpuclaim.core.errors import IllegalTransition


def test_every_job_state_is_active_or_final_never_both() -> None:
    for state in states.JobState:
        value = state.value
        assert (value in states.ACTIVE_JOB_STATES) != (value in states.FINAL_STATES), value


def test_ended_badly_is_final_and_not_success() -> None:
    for value in states.FINAL_STATES:
        assert states.ended(value)
        assert states.ended_badly(value) == (value != "succeeded")
    assert states.never_ran("cancelled") and not states.never_ran("failed")


# -- the transition table ---------------------------------------------------------------------
REFUSED = [
    ("succeeded", "running"),  # an end is final
    ("failed", "succeeded"),
    ("lost", "succeeded"),  # gc judged it lost first: a late wrapper does not rewrite it
    ("killed", "queued"),
    ("cancelled", "running"),
    ("timeout", "failed"),
    ("running", "queued"),  # nothing goes back: a requeued preempted job is a new record
    ("preempted", "queued"),
    ("starting", "queued"),
    ("running", "starting"),
    ("running", "cancelled"),  # cancelled means it never ran
    ("starting", "cancelled"),
]
ALLOWED = [
    ("queued", "starting"),
    ("queued", "running"),
    ("queued", "cancelled"),
    ("queued", "killed"),  # kill of a queued job
    ("starting", "running"),
    ("starting", "failed"),  # could not start
    ("running", "succeeded"),
    ("running", "timeout"),
    ("running", "lost"),
    ("running", "running"),  # a gang's second rank: the job already runs
    ("succeeded", "succeeded"),
    ("running", "preempted"),  # a --preemptible job yielded its GPUs
    ("starting", "preempted"),
    ("paused", "queued"),  # a state of a newer gpuclaim is not judged here
]


@pytest.mark.parametrize(("old", "new"), REFUSED)
def test_an_illegal_change_is_refused_naming_both_states(old: str, new: str) -> None:
    assert not states.may_follow(old, new)
    with pytest.raises(IllegalTransition, match=f"'{new}' may not follow '{old}'"):
        states.check_transition(old, new, "job j-1")


@pytest.mark.parametrize(("old", "new"), ALLOWED)
def test_the_changes_a_job_goes_through_are_allowed(old: str, new: str) -> None:
    assert states.may_follow(old, new)
    states.check_transition(old, new, "job j-1")


def test_the_table_covers_every_job_state() -> None:
    assert set(states.JOB_TRANSITIONS) == {s.value for s in states.JobState}
    for end in states.FINAL_STATES:
        assert states.JOB_TRANSITIONS[end] == frozenset()
