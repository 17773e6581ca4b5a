#!/usr/bin/env python3
"""Placing a share of a GPU (``--gpu-mem``) against placing a whole GPU, in the same run:
the store's primitive (acquire + remove, on one GPU already holding two shares) and the
whole CLI step (``claim --gpu-mem 20G`` + ``release`` against ``claim -n 1`` + ``release``,
in the demo sandbox), interleaved so that noise falls on both alike. Target: within 1.1x.

    python bench/shares.py [--repeat 300] [--cli-repeat 30]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuclaim.core.identity import this_host  # noqa: E402
from gpuclaim.core.model import Claim, ClaimedGpu  # noqa: E402
from gpuclaim.store import ClaimStore, new_claim_id  # noqa: E402

TOTAL_MIB = 81559
SHARED_GPU = "GPU-00000000-0000-0000-0000-000000000000"
WHOLE_GPU = "GPU-00000001-0000-0000-0000-000000000000"


def _claim(store: ClaimStore, uuid: str, mem_mib: int = 0) -> Claim:
    now = store.now()
    return Claim(
        id=new_claim_id(),
        user="bench",
        node="node01",
        gpus=(ClaimedGpu(uuid, 0 if uuid == SHARED_GPU else 1),),
        since=now,
        expires=now + 3600,
        host=this_host(),
        pid=os.getpid(),
        mem_mib=mem_mib,
        mem_total_mib=TOTAL_MIB if mem_mib else 0,
    )


def _once(store: ClaimStore, claim: Claim) -> float:
    t0 = time.perf_counter()
    store.acquire(claim)
    store.remove_gpu(claim.uuids[0], claim.id)
    return time.perf_counter() - t0


def primitive(root: Path, repeat: int) -> tuple[float, float]:
    """Median seconds of a share's and a whole claim's acquire + remove."""
    store = ClaimStore(root)
    store.ensure(create=True)
    for _ in range(2):  # two neighbours already there: the share's count reads them
        store.acquire(_claim(store, SHARED_GPU, 19074))
    share, whole = [], []
    for _ in range(repeat):
        share.append(_once(store, _claim(store, SHARED_GPU, 19074)))
        whole.append(_once(store, _claim(store, WHOLE_GPU)))
    return statistics.median(share), statistics.median(whole)


def _cli(args: list[str]) -> str:
    from gpuclaim.entry.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(args) == 0, args
    return out.getvalue()


def cli(repeat: int) -> tuple[float, float]:
    """Median seconds of ``claim --gpu-mem 20G`` + release and ``claim -n 1`` + release."""
    share, whole = [], []
    for _ in range(repeat):
        for asked, samples in ((["--gpu-mem", "20G"], share), (["-n", "1"], whole)):
            t0 = time.perf_counter()
            claim = json.loads(_cli(["claim", *asked, "--json"]))
            _cli(["release", claim["id"]])
            samples.append(time.perf_counter() - t0)
    return statistics.median(share), statistics.median(whole)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--cli-repeat", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gcbench-") as tmp:
        base = Path(tmp)
        store_share, store_whole = primitive(base / "s1", args.repeat)
        os.environ.update(GPUCLAIM_HOME=str(base / "home"), GPUCLAIM_USER="bench")
        from gpuclaim.app.sandbox import create_sandbox

        os.environ["GPUCLAIM_CONFIG"] = str(create_sandbox(base / "demo"))
        cli_share, cli_whole = cli(args.cli_repeat)
    print(
        json.dumps(
            {
                "store_share_ms": round(store_share * 1000, 3),
                "store_whole_ms": round(store_whole * 1000, 3),
                "store_ratio": round(store_share / store_whole, 2),
                "cli_share_ms": round(cli_share * 1000, 1),
                "cli_whole_ms": round(cli_whole * 1000, 1),
                "cli_ratio": round(cli_share / cli_whole, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
