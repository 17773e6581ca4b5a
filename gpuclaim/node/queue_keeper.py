"""The queue's keeper: starts queued jobs on a node as soon as its GPUs free up, whatever
freed them, with no gpuclaim call and no daemon that runs all the time.

A job's end, ``kill``, ``release`` and ``gc`` already start queued jobs (the wrapper or the
command that freed the GPUs dispatches). A claim that simply expires has nobody to notice, so
while a job waits, one keeper per node (a small process started over SSH when the job is
queued, detached from the session) reads the store every couple of seconds: when the claims
on its node change (one expired, one was released by a crash or by hand), it dispatches there.
It exits as soon as no queued job could use its node. One per node, store and account: each
account starts only its own jobs (``core/accounts.py``), so when another account's job ends
it is this keeper, polling every second, that hands its GPUs over to its account's job. A lock
in the store, refreshed while it lives, so a keeper that dies is replaced by the next one
started (and others' dispatch can tell whether it lives: ``engine/owners.py``).

Node-side code: standard library only, Python 3.9.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.accounts import keeper_lock, runs_as, this_account
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.priority import parse_entry
from gpuclaim.core.states import JobState

if TYPE_CHECKING:
    from gpuclaim.core.config import Config
    from gpuclaim.core.protocol import KeeperSpec
    from gpuclaim.store import ClaimStore, Store

POLL_S = 1.0  # how often the store is read: a hand-over from another account takes about this
RETRY_S = 60.0  # a dispatch at least this often (GPUs freed outside gpuclaim's view)
MAX_FAILURES = 5  # consecutive store errors (the store is gone): stop


def run_keeper(spec_path: str) -> int:
    from gpuclaim.core.config import parse_config
    from gpuclaim.store import ClaimStore

    spec: KeeperSpec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    node = str(spec["node"])
    config = parse_config(spec["config"])
    store = ClaimStore(Path(spec["store_root"]))
    lock_name = keeper_lock(node, this_account().uid)
    try:
        lock = store.try_lock(lock_name)
    except GpuclaimError:
        return 1
    if lock is None:
        return 0  # a keeper for this node runs already
    with lock:
        return _keep(config, store, node, lock_name)


def _keep(config: Config, store: ClaimStore, node: str, lock_name: str) -> int:
    from gpuclaim.engine.dispatch import dispatch_queue
    from gpuclaim.node.channel import local_prober

    prober = local_prober(config, node)
    seen: Optional[tuple[Any, ...]] = None
    last_dispatch = 0.0
    failures = 0
    never: set[str] = set()
    while store.root.is_dir():  # a store that was removed has no queue left to keep
        try:
            store.refresh_lock(lock_name)
            if not _waiting_for(store, node, never):
                return 0
            now_seen = _what_matters(store, node)
            if now_seen != seen or time.monotonic() - last_dispatch > RETRY_S:
                dispatch_queue(config, store, prober, only_node=node)
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


def _waiting_for(store: Store, node: str, never: set[str]) -> bool:
    """Is any queued job of this account one that this node could start on its own?
    ``never``: the jobs already found to be others' or to need other nodes (that does not
    change), so a poll reads only the records it has not judged for good."""
    me = this_account()
    for name in store.queue_entries():
        entry = parse_entry(name)
        if entry is None or entry.job_id in never:
            continue
        job = store.load_job(job_id=entry.job_id)
        if job is None or job.state != JobState.QUEUED:
            continue
        if not runs_as(job, me) or job.node not in (None, node) or job.nodes_wanted != 1:
            never.add(job.id)
            continue
        return True
    return False


def _what_matters(store: Store, node: str) -> tuple[Any, ...]:
    """What would change this node's answer to the queue: its claims and how they are judged
    (an expired one turns stale), and the queue itself."""
    snap = store.snapshot()
    claims = sorted((s.claim.id, s.state) for s in snap.claims.values() if s.claim.node == node)
    damaged = sorted(f.uuid for f in snap.corrupt())
    # a booking's window opening (or closing) changes who may start here
    windows = sorted(
        (b.id, b.is_open(snap.now)) for b in getattr(snap, "bookings", ()) if b.node == node
    )
    # a job's --begin passing makes it one that may start now
    entries = [e for e in map(parse_entry, store.queue_entries()) if e is not None]
    begun = sorted(e.name for e in entries if e.begin and e.begin <= snap.now)
    queue = tuple(e.name for e in entries)
    return (tuple(claims), tuple(damaged), queue, tuple(windows), tuple(begun))
