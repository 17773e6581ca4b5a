"""The array side of ``run`` (``--array``, ``--sweep``), of ``jobs`` (an array is one line)
and of ``kill NAME`` (a whole array)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from gpuclaim.cli.common import AppState, out, print_json, waiting
from gpuclaim.core.errors import GpuclaimError, UsageError
from gpuclaim.core.states import JobState


def array_request(
    req: Any, array: Optional[str], sweep: Optional[Path], max_running: Optional[int]
) -> Any:
    """The ``ArrayRequest`` for ``run --array SPEC`` / ``--sweep FILE``, checked here."""
    from gpuclaim.core.arrays import parse_array_spec, parse_sweep
    from gpuclaim.engine.arrays import ArrayRequest

    if array is not None and sweep is not None:
        raise UsageError("--array and --sweep: one task list per run (a sweep file's lines)")
    if sweep is not None:
        try:
            text = sweep.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"--sweep {sweep}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--sweep {sweep}: cannot read it: {exc}") from None
        words = parse_sweep(text, str(sweep))
        return ArrayRequest(
            run=req,
            indices=tuple(range(len(words))),
            spec=str(sweep),
            max_running=max_running,
            words=tuple(words),
        )
    assert array is not None
    spec = parse_array_spec(array)
    if spec.max_running and max_running and spec.max_running != max_running:
        raise UsageError(f"--array {array} and --max-running {max_running} disagree: give one")
    limit = spec.max_running or max_running
    return ArrayRequest(run=req, indices=spec.indices, spec=array, max_running=limit)


def submit_and_report(st: AppState, areq: Any, as_json: bool, quiet: bool) -> None:
    from gpuclaim.cli import completion
    from gpuclaim.engine.arrays import describe, submit_array

    count = len(areq.indices)
    with waiting(f"queueing {count} tasks", quiet):
        done = submit_array(st.config, st.store, areq, st.prober, st.ops)
    completion.remember(
        st.config.path, add={"jobs": [(str(done.record["name"]), f"array of {count} tasks")]}
    )
    if as_json:
        print_json(done.to_dict())
        return
    if quiet:
        return
    counts = done.counts()
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda c: -c[1]))
    limit = f"; at most {areq.max_running} at once" if areq.max_running else ""
    name = done.record["name"]
    console = out()
    console.print(
        f"Submitted {describe(done.record)}: {count} tasks ({said}){limit}.",
        markup=False,
        highlight=False,
    )
    console.print(
        f"  tasks:  gpuclaim jobs --tasks   (one: gpuclaim logs '{name}[i]')", markup=False
    )
    console.print(f"  stop:   gpuclaim kill {name}", markup=False)


def kill_array_by_name(st: AppState, name: str, force: bool, as_json: bool, quiet: bool) -> bool:
    """``kill NAME`` of an array that has not ended: True if NAME was one."""
    from gpuclaim.core.arrays import split_task_name
    from gpuclaim.engine.arrays import find_array, kill_array

    if split_task_name(name) is not None:
        return False  # NAME[i]: one task, a job like any other
    record = find_array(st.store, st.user, name, anyone=force)
    if record is None:
        return False
    if record["user"] != st.user and not force:
        raise GpuclaimError(f"array {name} belongs to {record['user']}", hint="use --force")
    with waiting(f"stopping array {name}", quiet):
        tasks = kill_array(
            st.config, st.store, st.user, record, st.ops, st.config.limits.kill_grace_s + 15
        )
    if quiet:
        return True
    if as_json:
        print_json({**record, "tasks": [t.to_dict() for t in tasks]})
        return True
    counts: dict[str, int] = {}
    for t in tasks:
        counts[t.state] = counts.get(t.state, 0) + 1
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    out().print(f"{name}: {len(tasks)} tasks, {said}.", markup=False, highlight=False)
    return True


def array_instead(st: AppState, name: str, exc: GpuclaimError) -> GpuclaimError:
    """``logs sweep`` where sweep is an array: say how to name one task."""
    from gpuclaim.engine.arrays import find_array

    record = find_array(st.store, st.user, name, active_only=False)
    if record is None:
        return exc
    first = (record.get("indices") or [0])[0]
    return UsageError(
        f"{name} is an array of {record['count']} tasks: name one, e.g. '{name}[{first}]'"
    )


def grouped_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``jobs``: an array's tasks as one row with its counts, where its first task was."""
    from gpuclaim.core.arrays import compact

    groups: dict[str, list[dict[str, Any]]] = {}
    result: list[dict[str, Any]] = []
    for d in rows:
        array = d.get("array")
        if not array:
            result.append(d)
            continue
        if d.get("requeued_as"):
            continue  # a preempted run of a task that runs again: its rerun is the task now
        if array["id"] not in groups:
            groups[array["id"]] = []
            result.append({"_array": array["id"]})
        groups[array["id"]].append(d)
    return [_array_row(groups[d["_array"]], compact) if "_array" in d else d for d in result]


def _array_row(tasks: list[dict[str, Any]], compact: Any) -> dict[str, Any]:
    array = tasks[0]["array"]
    from gpuclaim.cli.job_rows import array_row_state, state_text

    counts: dict[str, int] = {}
    for t in tasks:
        counts[t["state"]] = counts.get(t["state"], 0) + 1
    indices = tuple(int(t["array"]["index"]) for t in tasks)
    on = (JobState.RUNNING, JobState.STARTING)
    nodes = sorted({n for t in tasks if t["state"] in on for n in t["nodes"]})
    started = [t["started"] for t in tasks if t.get("started")]
    return {
        **tasks[0],
        "name": f"{array['name']}[{compact(indices)}]",
        "state": array_row_state(counts),
        "state_text": state_text(counts),
        "nodes": nodes,
        "gpus": [],
        "exit_code": None,
        "started": min(started) if started else None,
        "ends": None,
        "queue_position": None,
        # why the first of its queued tasks waits (the others wait behind it)
        "reason": min(
            (t for t in tasks if t["state"] == JobState.QUEUED),
            key=lambda t: t.get("queue_position") or 0,
            default={"reason": ""},
        )["reason"],
    }
