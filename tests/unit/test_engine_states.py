"""The engine's mappings over the job states are exhaustive (every JobState has its exit code,
its outcome line and its Slack icon, and a state from a newer gpuclaim keeps today's fallback);
event types and job kinds are enums that write the same strings as ever and read any string."""

from __future__ import annotations

import json

import pytest

from gpuclaim.core.config import SlackConfig
from gpuclaim.core.events import claim_event
from gpuclaim.core.model import (
    Claim,
    ClaimedGpu,
    Event,
    EventType,
    Job,
    JobKind,
    event_type,
    job_kind,
)
from gpuclaim.core.states import GpuState, JobState
from gpuclaim.engine.job_watch import (
    KILLED_EXIT,
    LOST_EXIT,
    NEVER_RAN_EXIT,
    PREEMPTED_EXIT,
    TIMEOUT_EXIT,
    exit_code,
    exit_code_of,
    outcome_line,
)
from gpuclaim.engine.notify import MESSAGE_EVENTS, end_icon, render_message, wanted

# README, "Exit codes": what `run --follow` and `logs -f` exit with, the job's own code 7.
EXIT_CODES = {
    JobState.QUEUED: 1,
    JobState.STARTING: 1,
    JobState.RUNNING: 1,
    JobState.SUCCEEDED: 0,
    JobState.FAILED: 7,
    JobState.KILLED: KILLED_EXIT,
    JobState.TIMEOUT: TIMEOUT_EXIT,
    JobState.LOST: LOST_EXIT,
    JobState.CANCELLED: NEVER_RAN_EXIT,
    JobState.PREEMPTED: PREEMPTED_EXIT,
}
ICONS = {
    JobState.SUCCEEDED: "✅",
    JobState.FAILED: "❌",
    JobState.TIMEOUT: "⏱",
    JobState.KILLED: "🛑",
    JobState.PREEMPTED: "⏏",
    JobState.LOST: "•",
    JobState.CANCELLED: "•",
    JobState.QUEUED: "•",
    JobState.STARTING: "•",
    JobState.RUNNING: "•",
}


def _job(state: str, exit_code: int | None = None, reason: str = "") -> Job:
    return Job(
        id="j-1",
        name="train",
        user="ann",
        argv=("python", "train.py"),
        state=state,
        submitted=1000.0,
        time_limit_s=3600.0,
        started=1010.0,
        ended=1022.0,
        exit_code=exit_code,
        reason=reason,
    )


def test_the_tables_name_every_job_state() -> None:
    assert set(EXIT_CODES) == set(JobState) and set(ICONS) == set(JobState)


@pytest.mark.parametrize("state", list(JobState))
def test_every_job_state_has_its_exit_code(state: JobState) -> None:
    assert exit_code(state, 7) == EXIT_CODES[state]
    assert exit_code_of(_job(state.value, exit_code=7)) == EXIT_CODES[state]


def test_a_failed_job_without_a_code_of_its_own_exits_1_and_a_newer_state_too() -> None:
    assert exit_code_of(_job(JobState.FAILED.value)) == 1
    assert exit_code_of(_job("paused", exit_code=7)) == 1  # a state a newer gpuclaim wrote


@pytest.mark.parametrize("state", list(JobState))
def test_every_job_state_has_its_outcome_line(state: JobState) -> None:
    line = outcome_line(_job(state.value, exit_code=7, reason="never ran: prep failed"), 2000.0)
    assert line.startswith("job train ") and "<" not in line


def test_the_outcome_lines_are_worded_as_before() -> None:
    def line(state: str, code: int | None = 7, reason: str = "") -> str:
        return outcome_line(_job(state, code, reason), 2000.0)

    assert line("succeeded", 0) == "job train succeeded after 12s"
    assert line("failed") == "job train failed (exit code 7) after 12s"
    assert line("failed", None, "no such workdir") == (
        "job train failed (no such workdir; exit code 1) after 12s"
    )
    assert line("timeout", None) == (
        "job train reached its time limit of 1h (exit code 124) after 12s"
    )
    assert line("lost", None) == (
        "job train was lost: its node, tmux or wrapper went away (exit code 255) after 12s"
    )
    assert line("killed", None) == "job train was killed (exit code 143) after 12s"
    assert line("cancelled", None, "never ran: prep failed") == (
        "job train never ran: prep failed (exit code 1)"
    )
    assert line("cancelled", None) == "job train never ran: it was cancelled (exit code 1)"
    assert line("paused", None) == "job train was paused (exit code 1) after 12s"


@pytest.mark.parametrize("state", list(JobState))
def test_every_end_state_has_its_slack_icon(state: JobState) -> None:
    assert end_icon(state) == ICONS[state]
    message = render_message(_end_event(state.value, exit_code=3), SlackConfig())
    text = f"{ICONS[state]} ann's job *train* {state.value}"
    if state is not JobState.SUCCEEDED:
        text += " (exit code 3)"
    assert message["blocks"][0]["text"]["text"] == text


def test_a_job_end_in_a_newer_state_or_none_gets_the_plain_bullet() -> None:
    for state, said in (("paused", "paused"), (None, "ended")):
        event = _end_event(state, exit_code=None)
        text = render_message(event, SlackConfig())["blocks"][0]["text"]["text"]
        assert text == f"• ann's job *train* {said}"


def test_a_job_killed_from_outside_says_why_and_a_gpuclaim_kill_does_not() -> None:
    from dataclasses import replace

    def text(reason: str) -> str:
        event = replace(_end_event("killed", exit_code=143), reason=reason)
        return str(render_message(event, SlackConfig())["blocks"][0]["text"]["text"])

    assert text("kill") == "🛑 ann's job *train* killed (exit code 143)"
    assert text("killed") == text("kill") == text("")
    said = text("its tmux session went away (SIGHUP)")
    assert said == text("kill") + ": its tmux session went away (SIGHUP)"


def _end_event(state: str | None, exit_code: int | None) -> Event:
    extra = {"job": "train", "exit_code": exit_code, "gpus_total": 1}
    if state is not None:
        extra["state"] = state
    return Event(ts=1060.0, type=EventType.JOB_END, user="ann", node="n1", gpus=(0,), extra=extra)


@pytest.mark.parametrize("kind", list(EventType))
def test_every_event_type_round_trips_through_the_log(kind: EventType) -> None:
    event = Event(ts=1000.0, type=kind, user="ann", node="n1", gpus=(0, 1))
    line = json.dumps(event.to_dict())
    assert json.loads(line)["type"] == kind.value and f'"type": "{kind.value}"' in line
    back = Event.from_dict(json.loads(line))
    assert back == event and back.type == kind and event_type(back.type) is kind
    assert back.to_dict() == event.to_dict()


def test_an_event_type_is_its_word_everywhere_but_repr() -> None:
    kind = EventType.FORCE_RELEASE
    assert kind == "force-release" and str(kind) == f"{kind}" == "force-release"
    assert json.dumps({kind: kind}) == '{"force-release": "force-release"}'
    assert {kind: 1}.get("force-release") == 1 and f"{kind:>14}" == " force-release"
    assert EventType.BUSY_UNCLAIMED.value == GpuState.BUSY_UNCLAIMED.value


def test_an_event_of_a_newer_type_is_read_kept_and_not_sent() -> None:
    event = Event.from_dict({"ts": "2024-01-01T00:00:00Z", "type": "teleport", "user": "ann"})
    assert event.type == "teleport" and event_type(event.type) is None
    assert event.to_dict()["type"] == "teleport"
    assert not wanted(event, SlackConfig(events=("teleport",)))
    assert render_message(event, SlackConfig())["text"] == "teleport: ann "


def test_every_event_type_that_becomes_a_message_is_a_member() -> None:
    assert all(event_type(k) is not None for k in MESSAGE_EVENTS)


def test_the_events_built_from_a_claim_carry_the_type() -> None:
    claim = Claim("c-1", "ann", "n1", (ClaimedGpu("GPU-a", 0),), 1000.0, 2000.0)
    assert claim_event(EventType.RELEASE, claim, 1500.0).to_dict()["type"] == "release"


def test_a_job_kind_writes_its_word_and_any_kind_is_read() -> None:
    job = _job(JobState.QUEUED.value)
    assert job.kind is JobKind.BATCH and job.to_dict()["kind"] == "batch"
    assert json.dumps(job.to_dict()).count('"kind": "batch"') == 1
    data = {**job.to_dict(), "kind": "vscode"}  # a kind a newer gpuclaim added
    assert Job.from_dict(data).kind == "vscode" and job_kind("vscode") is None
    assert Job.from_dict(data).to_dict()["kind"] == "vscode"
    for kind in JobKind:
        back = Job.from_dict({**job.to_dict(), "kind": kind.value})
        assert back.kind == kind and job_kind(back.kind) is kind
    old = {k: v for k, v in job.to_dict().items() if k != "kind"}  # before kinds
    assert Job.from_dict(old).kind == JobKind.BATCH
