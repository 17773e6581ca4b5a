"""``jobs``' table: the REASON column says why queued work waits, and only that."""

from __future__ import annotations

from rich.console import Console

from gpuclaim.cli.arrays import grouped_rows
from gpuclaim.cli.render import jobs_table


def _row(name: str, state: str, reason: str = "", **more: object) -> dict:
    return {"name": name, "user": "dave", "state": state, "reason": reason, "argv": ["x"], **more}


def _text(rows: list[dict]) -> str:
    console = Console(width=200, record=True)
    console.print(jobs_table(rows, 0.0))
    return console.export_text()


def test_an_arrays_line_shows_why_its_queued_tasks_wait():
    why = "Resources: needs 1 GPU on one node; node01 has 0 free"
    tasks = [
        _row(
            f"grid[{i}]",
            state,
            why if state == "queued" else "",
            queue_position=position,
            array={"id": "a-1", "name": "grid", "index": i},
            nodes=["node01"],
        )
        for i, (state, position) in enumerate([("running", None), ("queued", 2), ("queued", 3)])
    ]
    text = _text(grouped_rows(tasks))
    assert "REASON" in text and "grid[0-2]" in text and why in text


def test_an_ended_jobs_reason_is_not_a_reason_to_wait():
    text = _text([_row("old", "cancelled", "never ran: prep failed"), _row("new", "running")])
    assert "REASON" not in text and "never ran" not in text
