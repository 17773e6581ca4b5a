"""The queue's keeper: starts queued jobs on a node as soon as its GPUs free up, whatever
freed them, with no gpuclaim call and no daemon that runs all the time.

A job's end, ``kill``, ``release`` and ``gc`` already start queued jobs (the wrapper or the
command that freed the GPUs dispatches). A claim that simply expires has nobody to notice, so
while a job waits, one keeper per node (a small process started over SSH when the job is
queued, detached from the session) reads the store every couple of seconds: when the claims
on its node change (one expired, one was released by a crash or by hand), it dispatches there.
It exits as soon as no queued job could use its node. One per node and store: a lock in the
store, refreshed while it lives, so a keeper that dies is replaced by the next one started.

Node-side code: standard library only, Python 3.9.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from gpuclaim.errors import GpuclaimError

POLL_S = 2.0  # how often the store is read: the delay after an expiry is at most this much more
RETRY_S = 60.0  # a dispatch at least this often (GPUs freed outside gpuclaim's view)
MAX_FAILURES = 5  # consecutive store errors (the store is gone): stop


def start_keeper(spec: dict[str, Any]) -> dict[str, Any]:
    """Start a keeper for ``spec["node"]`` detached from this session (it outlives the SSH
    command that started it); if one runs already, the new one exits at once."""
    from gpuclaim.runner import agent_entry, jobs_home

    node = str(spec["node"])
    directory = jobs_home() / "keepers"
    directory.mkdir(parents=True, exist_ok=True)
    # one per node and store: two clusters may name a node alike on one machine
    name = f"{node}-{hashlib.sha1(str(spec['store_root']).encode()).hexdigest()[:10]}"
    spec_path = directory / f"{name}.json"
    tmp = directory / f".{name}.{os.getpid()}.json"
    # The spec carries the config, and with it the Slack webhook (a secret): owner only.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(spec))
    tmp.replace(spec_path)
    log = open(directory / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        proc = subprocess.Popen(
            [*agent_entry(), "keep-queue", str(spec_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # not killed with the SSH session that started it
            cwd=str(Path.home()),
        )
    finally:
        log.close()
    return {"pid": proc.pid}


def run_keeper(spec_path: str) -> int:
    from gpuclaim.config import parse_config
    from gpuclaim.store import ClaimStore

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    node = str(spec["node"])
    config = parse_config(spec["config"])
    store = ClaimStore(Path(spec["store_root"]))
    lock_name = f"queue-keeper-{node}"
    try:
        lock = store.try_lock(lock_name)
    except GpuclaimError:
        return 1
    if lock is None:
        return 0  # a keeper for this node runs already
    with lock:
        return _keep(config, store, node, lock_name)


def _keep(config: Any, store: Any, node: str, lock_name: str) -> int:
    from gpuclaim.jobs import dispatch_queue

    seen: Optional[tuple[Any, ...]] = None
    last_dispatch = 0.0
    failures = 0
    while store.root.is_dir():  # a store that was removed has no queue left to keep
        try:
            store.refresh_lock(lock_name)
            if not _waiting_for(store, node):
                return 0
            now_seen = _what_matters(store, node)
            if now_seen != seen or time.monotonic() - last_dispatch > RETRY_S:
                dispatch_queue(config, store, only_node=node)
                last_dispatch = time.monotonic()
                now_seen = _what_matters(store, node)
            seen = now_seen
            failures = 0
        except GpuclaimError as exc:
            failures += 1
            print(f"gpuclaim queue keeper on {node}: {exc}", flush=True)
            if failures >= MAX_FAILURES:
                return 1
        time.sleep(POLL_S)
    return 0


def _waiting_for(store: Any, node: str) -> bool:
    """Is any queued job one that this node could start on its own?"""
    for entry in store.queue_entries():
        data = store.load_job_dict(job_id=entry.split("-", 1)[1])
        if not data or data.get("state") != "queued":
            continue
        if data.get("node") in (None, node) and int(data.get("nodes_wanted") or 1) == 1:
            return True
    return False


def _what_matters(store: Any, node: str) -> tuple[Any, ...]:
    """What would change this node's answer to the queue: its claims and how they are judged
    (an expired one turns stale), and the queue itself."""
    snap = store.snapshot()
    claims = sorted((s.claim.id, s.state) for s in snap.claims.values() if s.claim.node == node)
    damaged = sorted(f.uuid for f in snap.corrupt())
    return (tuple(claims), tuple(damaged), tuple(store.queue_entries()))
