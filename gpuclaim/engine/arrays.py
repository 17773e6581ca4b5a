"""``run --array SPEC`` and ``run --sweep FILE``: one queued task per index, each a job of
its own (its claim, its tmux session, ``NAME[i]``), dispatched by whoever runs gpuclaim next
and by the job wrappers as GPUs free up, at most ``%K`` at once; ``kill NAME`` ends them all.

Standard library only, like the rest of the engine."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

from gpuclaim.core.arrays import ARRAY_ID_PREFIX, compact, task_name
from gpuclaim.core.config import Config
from gpuclaim.core.errors import ConflictError
from gpuclaim.core.events import job_event
from gpuclaim.core.model import ArrayRef, EventType, Job
from gpuclaim.core.records import ArrayRecord
from gpuclaim.core.states import ACTIVE_JOB_STATES, JobState, started
from gpuclaim.engine.array_records import array_tasks, task_id
from gpuclaim.engine.cluster import NodeProber, build_view
from gpuclaim.engine.depends import resolve_after
from gpuclaim.engine.dispatch import dispatch_queue
from gpuclaim.engine.jobs import (
    RunRequest,
    check_fits,
    check_queue_room,
    checked_name,
    checked_time,
    enqueue,
    job_from_request,
    stop_and_wait,
    take_out_of_queue,
)
from gpuclaim.engine.launch import NodeOps, nodes_for, start_keepers
from gpuclaim.engine.policy import lab_config
from gpuclaim.engine.sync import push_copies
from gpuclaim.store import Store


@dataclass(frozen=True)
class ArrayRequest:
    """``run --array`` or ``--sweep``: the run each task is made from, and its tasks."""

    run: RunRequest  # the command (each task's argv starts with it), its GPUs, time, name
    indices: tuple[int, ...]
    spec: str  # as the user gave it: '0-95%8', or the sweep file's name
    max_running: Optional[int] = None
    words: Optional[tuple[tuple[str, ...], ...]] = None  # --sweep: each task's own words


@dataclass(frozen=True)
class ArraySubmitted:
    """An array as submitted: its record and its tasks."""

    record: ArrayRecord
    tasks: list[Job]

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for task in self.tasks:
            found[task.state] = found.get(task.state, 0) + 1
        return found

    def to_dict(self) -> dict[str, Any]:
        return {**self.record, "states": self.counts(), "tasks": [t.to_dict() for t in self.tasks]}


def submit_array(
    config: Config,
    store: Store,
    areq: ArrayRequest,
    prober: NodeProber,
    ops: Optional[NodeOps] = None,
) -> ArraySubmitted:
    """Queue every task, start those that fit now, and return at once: the rest start as
    GPUs free up, from the nodes (job wrappers, keepers), with no call from here."""
    req = areq.run
    config = lab_config(config, store)
    time_s = checked_time(config, req)
    name = checked_name(store, req)
    after = resolve_after(store, req.user, req.after, req.after_any, name)
    ops = ops or NodeOps(config, prober)
    array_id = ARRAY_ID_PREFIX + uuid.uuid4().hex[:10]
    now = store.now()
    count = len(areq.indices)
    ref = ArrayRef(array_id, name, areq.indices[0], count, areq.max_running)
    template = job_from_request(req, task_id(array_id, 0), name, time_s, now, array=ref)
    view = build_view(config, store, nodes_for(config, template), prober=prober)
    check_fits(config, view, template)
    check_queue_room(config, store, req.user, count)
    workdir, copied = req.workdir, None
    if req.sync is not None:  # one copy for the whole array, on every node it may run on
        nodes = [n for n in nodes_for(config, template) if n.name not in view.unreachable]
        copy, copied = push_copies(config, ops, nodes, req.sync, array_id)
        workdir = f"{copy}/{req.sync_subdir}" if req.sync_subdir else copy
    record: ArrayRecord = {
        "id": array_id,
        "name": name,
        "user": req.user,
        "spec": areq.spec,
        "indices": list(areq.indices),
        "count": count,
        "max_running": areq.max_running,
        "argv": list(req.argv),
        "sweep": areq.words is not None,
        "submitted": now,
        "after": [d.to_dict() for d in after],
    }
    store.create_array(array=record)
    tasks = []
    for position, index in enumerate(areq.indices):
        words = areq.words[position] if areq.words is not None else ()
        env = dict(req.env)
        env.update(
            GPUCLAIM_ARRAY_JOB=array_id,
            GPUCLAIM_ARRAY_NAME=name,
            GPUCLAIM_ARRAY_INDEX=str(index),
            GPUCLAIM_ARRAY_COUNT=str(count),
        )
        task = job_from_request(
            replace(req, argv=(*req.argv, *words), env=tuple(env.items())),
            task_id(array_id, index),
            task_name(name, index),
            time_s,
            now,
            array=replace(ref, index=index),
            after=after,
        ).with_(workdir=workdir, synced=copied)
        task = store.create_job(job=task)
        enqueue(store, task)
        tasks.append(task)
    store.append_event(
        job_event(EventType.ARRAY_QUEUED, template, now, {"array_id": array_id, "count": count})
    )
    dispatch_queue(config, store, prober=prober, ops=ops)
    tasks = array_tasks(store, record)
    if any(t.state == JobState.QUEUED for t in tasks):
        start_keepers(config, ops, template, view)
    return ArraySubmitted(record, tasks)


def find_array(
    store: Store, user: str, name: str, active_only: bool = True, anyone: bool = False
) -> Optional[ArrayRecord]:
    """The newest array of ``user`` (of anyone, with ``anyone``) named ``name`` (or with that
    id); with ``active_only``, one that has not ended."""
    found = [
        r
        for r in store.list_arrays()
        if r.get("id") == name or (r.get("name") == name and (anyone or r.get("user") == user))
    ]
    if active_only:
        found = [r for r in found if not isinstance(r.get("result"), dict)]
    if anyone and len({r.get("user") for r in found}) > 1:
        raise ConflictError(f"several users have an array {name!r}: give its id")
    return max(found, key=lambda r: float(r.get("submitted") or 0)) if found else None


def kill_array(
    config: Config,
    store: Store,
    user: str,
    record: ArrayRecord,
    ops: NodeOps,
    wait_s: float = 0.0,
) -> list[Job]:
    """Every task of the array: the queued ones out of the queue first (so that a task that
    stops cannot start the next), then the running ones stopped, all at once."""
    tasks = array_tasks(store, record)
    if record.get("user") != user and tasks:  # --force: on the record and on Slack, once
        said = job_event(
            EventType.FORCE_KILL, tasks[0], store.now(), {"job": record["name"], "array": None}
        )
        store.append_event(replace(said, by=user, reason=f"killed by {user}"))
    entries = store.queue_entries()
    running: list[Job] = []
    for task in tasks:
        if task.state == JobState.QUEUED and take_out_of_queue(store, task, user, entries) is None:
            running.append(task)  # it started meanwhile
        elif started(task.state):
            running.append(task)
    stop_and_wait(config, store, running, ops, wait_s)
    return array_tasks(store, record)


def live_tasks(tasks: Sequence[Job]) -> list[Job]:
    return [t for t in tasks if t.state in ACTIVE_JOB_STATES]


def describe(record: ArrayRecord) -> str:
    """'sweep[0-95]' for a record: its name and its indices."""
    return f"{record['name']}[{compact(tuple(record.get('indices') or ()))}]"
