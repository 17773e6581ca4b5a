"""The one table of job states (core/states.py): every state is active or final, and the
questions "has it ended, and how" agree with it."""

from __future__ import annotations

from gpuclaim.core import states


def test_every_job_state_is_active_or_final_never_both() -> None:
    for state in states.JobState:
        value = state.value
        assert (value in states.ACTIVE_JOB_STATES) != (value in states.FINAL_STATES), value


def test_ended_badly_is_final_and_not_success() -> None:
    for value in states.FINAL_STATES:
        assert states.ended(value)
        assert states.ended_badly(value) == (value != "succeeded")
    assert states.never_ran("cancelled") and not states.never_ran("failed")
