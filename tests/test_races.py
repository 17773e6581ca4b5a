"""The core promise, shown with racing processes: two people claiming at the same instant never
get the same GPU, and a multi-GPU claim is never partial."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gpuclaim.store import ClaimStore

WORKERS = 8
ROUNDS = 500


def _cli_in_process(args: list[str]) -> tuple[int, str]:
    """The real CLI entry point (parsing, config, store), minus the interpreter start-up."""
    from gpuclaim.entry.main import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(args)
    return rc, stdout.getvalue()


def _racer(env: dict, user: str, rounds: int, barrier, results: str, seed: int) -> None:
    os.environ.update(env)
    os.environ["GPUCLAIM_USER"] = user
    rng = random.Random(seed)
    with open(results, "w") as out:
        for r in range(rounds):
            n = rng.choice((1, 1, 2))
            barrier.wait(timeout=120)
            rc, text = _cli_in_process(["claim", "-n", str(n), "--time", "1h", "--json"])
            claim = json.loads(text) if rc == 0 else None
            out.write(json.dumps({"round": r, "n": n, "rc": rc, "claim": claim}) + "\n")
            out.flush()
            barrier.wait(timeout=120)  # every claim of the round is in; the parent checks
            barrier.wait(timeout=120)
            if claim is not None:
                rc, _ = _cli_in_process(["release", claim["id"], "--json"])
                assert rc == 0
            barrier.wait(timeout=120)


@pytest.mark.slow
def test_eight_racing_processes_never_share_a_gpu(make_cluster, tmp_path):
    cluster = make_cluster({"node01": 4}, fast=True)
    env = cluster.env()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(WORKERS + 1)
    files = [tmp_path / f"racer{i}.jsonl" for i in range(WORKERS)]
    procs = [
        ctx.Process(target=_racer, args=(env, f"user{i}", ROUNDS, barrier, str(f), i))
        for i, f in enumerate(files)
    ]
    for p in procs:
        p.start()
    store = ClaimStore(cluster.storage)
    granted_total = conflicts = 0
    try:
        for r in range(ROUNDS):
            barrier.wait(timeout=120)  # claims start
            barrier.wait(timeout=120)  # claims done
            results = [_last_line(f) for f in files]
            assert all(res["round"] == r for res in results)
            won = [res for res in results if res["rc"] == 0]
            for res in results:
                assert res["rc"] in (0, 3), res  # granted, or "nothing free"
            # never two holders: the GPUs granted this round are disjoint...
            granted = [u for res in won for u in res["claim"]["gpu_uuids"]]
            assert len(granted) == len(set(granted)), f"round {r}: a GPU granted twice"
            # ...never a partial claim: each got exactly what it asked for...
            for res in won:
                assert len(res["claim"]["gpus"]) == res["n"]
            # ...and the store agrees with what the winners were told.
            snap = store.snapshot()
            assert {cid: sorted(s.present) for cid, s in snap.claims.items()} == {
                res["claim"]["id"]: sorted(res["claim"]["gpu_uuids"]) for res in won
            }
            assert all(s.state == "claimed" for s in snap.claims.values())
            lost = [res for res in results if res["rc"] == 3]
            granted_total += len(won)
            conflicts += len(lost)
            barrier.wait(timeout=120)  # releases start
            barrier.wait(timeout=120)  # releases done
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert granted_total >= ROUNDS * 2  # the race really happened, many times over
    assert not store.snapshot().files
    events, bad = store.read_events()
    assert bad == 0
    assert sum(e.type == "claim" for e in events) == granted_total
    assert sum(e.type == "release" for e in events) == granted_total


def test_racing_cli_processes(make_cluster):
    """The same race with whole `gpuclaim` processes, as two people at two terminals."""
    cluster = make_cluster({"node01": 4}, fast=True)
    for _ in range(3):
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "gpuclaim", "claim", "-n", "1", "--json"],
                env=cluster.env(user=f"u{i}"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(6)
        ]
        outs = [(p.wait(timeout=60), p.stdout.read(), p.stderr.read()) for p in procs]
        won = [json.loads(o) for rc, o, _ in outs if rc == 0]
        assert len(won) == 4
        assert sorted(rc for rc, _, _ in outs) == [0, 0, 0, 0, 3, 3]
        assert len({c["gpu_uuids"][0] for c in won}) == 4
        for p in procs:
            p.stdout.close()
            p.stderr.close()
        cluster.ok("release", "--force", *[c["id"] for c in won])


def _last_line(path: Path) -> dict:
    lines = path.read_text().splitlines()
    return json.loads(lines[-1])
