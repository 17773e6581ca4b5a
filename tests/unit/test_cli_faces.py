"""``status`` and ``jobs`` colour every state from core's tables (face_style, job_style); a
state this version does not know is printed as it is, uncoloured."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpuclaim.cli.render import jobs_table, status_summary
from gpuclaim.core.states import JobState, job_style
from gpuclaim.engine.cluster import GpuRow


def _job(state: str, **extra: Any) -> dict[str, Any]:
    return {"name": f"j-{state}", "user": "ann", "state": state, "argv": ["x"], **extra}


def _state_cells(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    table = jobs_table(rows, now=0.0)
    column = next(c for c in table.columns if c.header == "STATE")
    return [(cell.plain, str(cell.style)) for cell in column.cells]


def test_every_job_state_has_its_colour_in_jobs() -> None:
    cells = _state_cells([_job(s.value) for s in JobState])
    assert cells == [(s.value, job_style(s)) for s in JobState]
    assert all(style for _, style in cells)


def test_a_queued_job_shows_its_place_and_an_unknown_state_no_colour() -> None:
    rows = [_job(JobState.QUEUED.value, queue_position=2), _job("hibernating")]
    assert _state_cells(rows) == [("queued #2", job_style(JobState.QUEUED)), ("hibernating", "")]


def test_status_summary_counts_the_states_in_its_order() -> None:
    states = ["free", "free", "claimed", "busy-unclaimed", "reserved", "stale", "unreachable"]
    rows = [GpuRow("n1", i, None, s) for i, s in enumerate(states)]
    view: Any = SimpleNamespace(  # status_summary reads a ClusterView's rows only
        rows=[*rows, GpuRow("n2", None, None, "unreachable")]
    )
    assert status_summary(view) == (
        "2/7 GPUs free · 1 reserved · 1 claimed · 1 busy-unclaimed · 1 stale · 1 unreachable"
    )
