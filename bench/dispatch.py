#!/usr/bin/env python3
"""A dispatch pass with a long queue: 1,000 queued jobs of 6 users behind a busy cluster.

2 nodes x 4 GPUs, every GPU held by a claim; the queue holds one user's 500-task array, a
second user's 100-task array and 400 plain jobs of five users (1, 2 or 4 GPUs, some with
--nice, some with --begin later), each put there by the real ``enqueue``; the event log holds
``--history`` claim releases of the last two weeks for fair share to fold. Measured in
process, as the unit tier runs the engine (tests/unit/fakes.py: the real store in a temporary
directory on its own clock, nodes answering with recorded ``nvidia-smi`` output; no sshd, no
process started):

  cold      the first pass: fair share folds the whole event log (its kept sum removed)
  pass      ``judge_queue(every=False)``: the dispatch every gpuclaim call does
  every     ``judge_queue(every=True)``: what ``gpuclaim jobs`` does (every job judged)
  free      one node's claims released: the pass starts jobs there (a copy of the store
            each time, made with ``cp -a`` outside the timing)

    python bench/dispatch.py [--repeat 15] [--history 3000] [--profile] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuclaim.core.events import claim_event  # noqa: E402
from gpuclaim.core.model import Claim, ClaimedGpu, EventType  # noqa: E402
from gpuclaim.engine.arrays import ArrayRequest, submit_array  # noqa: E402
from gpuclaim.engine.claims import release_claims  # noqa: E402
from gpuclaim.engine.dispatch import QueueReport, judge_queue  # noqa: E402
from gpuclaim.engine.fairshare import STATE_FILE  # noqa: E402
from gpuclaim.engine.jobs import RunRequest, enqueue, job_from_request, new_job_id  # noqa: E402
from gpuclaim.store import new_claim_id  # noqa: E402
from tests.unit.fakes import HOUR, ClockedStore, Cluster, make_cluster  # noqa: E402

USERS = ("alice", "bob", "carol", "dave", "erin", "frank")
NODES = {"node01": 4, "node02": 4}
DAY = 86400.0
TARGET_MS = 100.0


def build(tmp: Path, history: int, seed: int = 1) -> Cluster:
    """The busy cluster, its history and its queue of 1,000 jobs."""
    rng = random.Random(seed)
    c = make_cluster(tmp, NODES)
    uuids = {n: [g.uuid for g in gpus] for n, gpus in c.nodes.gpus.items()}
    # The history: claims of the last two weeks, released (as engine/claims.py records them).
    now = c.clock.now
    for _ in range(history):
        user = rng.choice((*USERS, "gina"))  # one user with use and no queued job
        node = rng.choice(list(NODES))
        indices = sorted(rng.sample(range(NODES[node]), rng.choice((1, 1, 2, 4))))
        since = now - rng.uniform(1 * HOUR, 14 * DAY)
        length = rng.uniform(0.1 * HOUR, 12 * HOUR)
        claim = Claim(
            id=new_claim_id(),
            user=user,
            node=node,
            gpus=tuple(ClaimedGpu(uuids[node][i], i) for i in indices),
            since=since,
            expires=since + length + HOUR,
            host="bench",
            pid=1,
        )
        end = min(since + length, now - 60.0)
        c.store.append_event(claim_event(EventType.RELEASE, claim, end))
    # Every GPU held, until various times (what the plan's expected starts come from).
    for user, count, node, hours in (
        ("carol", 2, "node01", 3),
        ("dave", 2, "node01", 8),
        ("erin", 4, "node02", 24),
    ):
        c.claim(user, count, time_s=hours * HOUR, node=node)
    # The queue: alice's 500-task array, bob's 100-task array, 400 plain jobs of the others.
    for user, name, count in (("alice", "sweep", 500), ("bob", "ablate", 100)):
        c.clock.advance(30.0)
        run = RunRequest(user=user, argv=("python", "eval.py"), name=name, count=1)
        areq = ArrayRequest(run, tuple(range(count)), f"0-{count - 1}")
        submit_array(c.config, c.store, areq, c.prober)
    for i in range(400):
        c.clock.advance(rng.uniform(1.0, 20.0))
        user = USERS[1 + i % 5]
        req = RunRequest(
            user=user,
            argv=("python", "train.py"),
            name=f"train-{i}",
            count=rng.choice((1, 1, 2, 4)),
            nice=10 if i % 7 == 0 else 0,
            begin=c.clock.now + 6 * HOUR if i % 20 == 0 else None,
        )
        time_s = rng.choice((1, 2, 4, 12)) * HOUR
        job = job_from_request(req, new_job_id(), req.name or "", time_s, c.clock.now)
        c.store.create_job(job=job)
        enqueue(c.store, job)
    c.clock.advance(60.0)
    return c


def timed(fn: Callable[[], Any], repeat: int, before: Callable[[], None] = lambda: None) -> float:
    samples = []
    for _ in range(repeat):
        before()
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def profile(fn: Callable[[], Any], top: int = 14) -> str:
    """The top costs of one call, by own time and by time with callees."""
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    lines = out.getvalue().replace(str(REPO) + "/", "").splitlines()
    return "\n".join(line for line in lines if line.strip() and "Ordered by" not in line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--history", type=int, default=3000, help="claim releases in the log")
    ap.add_argument("--profile", action="store_true", help="cProfile of each pass, top costs")
    ap.add_argument("--json", action="store_true", help="a last line of JSON too")
    args = ap.parse_args()
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gcbench-") as tmp:
        base = Path(tmp)
        t0 = time.perf_counter()
        c = build(base / "busy", args.history)
        setup_s = time.perf_counter() - t0
        config, store, prober = c.config, c.store, c.prober
        queued = len(store.queue_entries())
        kept = store.root / "notify" / STATE_FILE

        def one_pass(every: bool = False, on: ClockedStore = store) -> QueueReport:
            return judge_queue(config, on, prober, every=every)

        def forget() -> None:
            kept.unlink(missing_ok=True)

        first = one_pass()  # warm-up: imports, the recording parsed, fair share kept
        if first.started:
            print(f"note: the busy cluster started {len(first.started)} job(s)", file=sys.stderr)
        result: dict[str, Any] = {"queued": queued, "history": args.history}
        result["cold_ms"] = timed(one_pass, max(3, args.repeat // 3), forget) * 1000
        one_pass()
        result["pass_ms"] = timed(one_pass, args.repeat) * 1000
        report = one_pass(every=True)
        result["every_ms"] = timed(lambda: one_pass(every=True), args.repeat) * 1000
        judged = sum(v.reason is not None for v in report.verdicts.values())
        profiles = {}
        if args.profile:
            profiles["pass"] = profile(one_pass)
            profiles["every"] = profile(lambda: one_pass(every=True))
            forget()
            profiles["cold"] = profile(one_pass)

        # One node's claims released: jobs start there (the fake nodes launch in memory).
        for cid, status in store.snapshot().claims.items():
            if status.claim.node == "node01":
                release_claims(config, store, status.claim.user, claim_ids=[cid])
        pristine = store.root.rename(base / "free")  # what each run starts from, copied
        starts, samples = [], []
        for _ in range(max(3, args.repeat // 2)):
            subprocess.run(["cp", "-a", str(pristine), str(store.root)], check=True)
            fresh = ClockedStore(store.root, c.clock)
            t0 = time.perf_counter()
            started = one_pass(on=fresh).started
            samples.append(time.perf_counter() - t0)
            starts.append(len(started))
            shutil.rmtree(store.root)
        result["free_ms"] = statistics.median(samples) * 1000
        result["free_started"] = max(starts)

    print(
        f"dispatch pass, {queued} queued jobs of {len(USERS)} users "
        f"(2 nodes x 4 GPUs, {args.history} releases in the log), "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    print(f"  setup {setup_s:.1f} s; median of {args.repeat} after a warm-up, ms")
    rows = (
        ("cold", result["cold_ms"], "first pass: fair share folds the whole log"),
        ("pass", result["pass_ms"], "judge_queue(every=False), all GPUs held"),
        ("every", result["every_ms"], f"judge_queue(every=True): {judged} judged"),
        ("free", result["free_ms"], f"node01 free: {result['free_started']} jobs started"),
    )
    for label, ms, what in rows:
        verdict = "ok" if ms <= TARGET_MS else "over"
        print(f"  {label:<6}{ms:>8.1f}   {verdict:<4}  {what}")
    print(f"  (target: a pass <= {TARGET_MS:.0f} ms; whole run {time.monotonic() - t_start:.0f} s)")
    for label, text in profiles.items():
        print(f"\n-- cProfile, {label} --")
        print(text)
    if args.json:
        print(
            json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()})
        )


if __name__ == "__main__":
    main()
