#!/usr/bin/env python3
"""Claims on a local store: one claim + release (the store's primitive and the whole CLI),
the CLI again with 100 bookings in the store, and 8 racing processes on 4 GPUs: throughput,
lost races, and double holders (must be 0).

    python bench/claims.py [--seconds 10] [--workers 8]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuclaim.core.errors import ConflictError  # noqa: E402
from gpuclaim.core.identity import this_host  # noqa: E402
from gpuclaim.core.model import Claim, ClaimedGpu  # noqa: E402
from gpuclaim.store import ClaimStore, new_claim_id  # noqa: E402

UUIDS = [f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4)]


def _claim(store: ClaimStore, indices: list[int]) -> Claim:
    now = store.now()
    return Claim(
        id=new_claim_id(),
        user=f"u{os.getpid()}",
        node="node01",
        gpus=tuple(ClaimedGpu(UUIDS[i], i) for i in indices),
        since=now,
        expires=now + 3600,
        host=this_host(),
        pid=os.getpid(),
    )


def primitive_latency(root: Path, repeat: int = 200) -> float:
    store = ClaimStore(root)
    store.ensure(create=True)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        claim = _claim(store, [0, 1])
        store.acquire(claim)
        for u in claim.uuids:
            store.remove_gpu(u, claim.id)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def cli_latency(repeat: int = 20) -> float:
    """`claim -n 1` + `release` through the CLI's entry point (one process, no start-up)."""
    from gpuclaim.entry.main import main

    samples = []
    for _ in range(repeat):
        out = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out):
            assert main(["claim", "-n", "1", "--json"]) == 0
            claim_id = json.loads(out.getvalue())["id"]
            assert main(["release", claim_id]) == 0
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def book_ahead(count: int) -> None:
    """``count`` bookings of another user, a day and more ahead: what every claim now reads."""
    from gpuclaim.entry.main import main

    os.environ["GPUCLAIM_USER"] = "other"
    try:
        for i in range(count):
            window = ["--start", f"+{24 + i}h", "--time", "1h", "-q"]
            assert main(["reserve", "--gpu", f"demo01:{i % 4}", *window]) == 0
    finally:
        os.environ["GPUCLAIM_USER"] = "bench"


def _racer(root: str, seconds: float, seed: int, results: mp.Queue) -> None:
    store = ClaimStore(Path(root))
    rng = random.Random(seed)
    won = lost = doubles = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        claim = _claim(store, sorted(rng.sample(range(4), rng.choice((1, 2)))))
        try:
            store.acquire(claim)
        except ConflictError:
            lost += 1
            continue
        won += 1
        for u in claim.uuids:  # what we hold must be ours, read back from the files
            held = json.loads((store.root / "gpus" / f"{u}.claim").read_text())["id"]
            doubles += held != claim.id
        for u in claim.uuids:
            store.remove_gpu(u, claim.id)
    results.put((won, lost, doubles))


def racing(root: Path, workers: int, seconds: float) -> tuple[float, int, int, int]:
    ClaimStore(root).ensure(create=True)
    ctx = mp.get_context("fork")
    results: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(str(root), seconds, i, results)) for i in range(workers)
    ]
    for p in procs:
        p.start()
    totals = [results.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    won = sum(t[0] for t in totals)
    return won / seconds, won, sum(t[1] for t in totals), sum(t[2] for t in totals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gcbench-") as tmp:
        base = Path(tmp)
        prim = primitive_latency(base / "s1")
        os.environ.update(GPUCLAIM_HOME=str(base / "home"), GPUCLAIM_USER="bench")
        from gpuclaim.app.sandbox import create_sandbox

        os.environ["GPUCLAIM_CONFIG"] = str(create_sandbox(base / "demo"))
        cli = cli_latency()
        book_ahead(100)
        cli_booked = cli_latency()
        rate, won, lost, doubles = racing(base / "s2", args.workers, args.seconds)
    print(
        json.dumps(
            {
                "claim_release_store_ms": round(prim * 1000, 2),
                "claim_release_cli_ms": round(cli * 1000, 1),
                "claim_release_cli_ms_100_bookings": round(cli_booked * 1000, 1),
                "racing_claims_per_s": round(rate, 1),
                "racing_won": won,
                "racing_lost_races": lost,
                "double_holders": doubles,
                "workers": args.workers,
            }
        )
    )


if __name__ == "__main__":
    main()
