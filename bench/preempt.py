#!/usr/bin/env python3
"""[fair] preemption hand-over, on the sshd testbed (1 node x 4 GPUs, real tmux and signals):

    python bench/preempt.py [--repeat 5]

  free       ``claim -n 2`` with 2 GPUs free (what a claim costs anyway)
  handover   ``claim -n 2`` when preemptible jobs hold every GPU and save-and-exit on
             SIGUSR1: the victims chosen, the hand-over booked, the signal read by their
             wrappers (a 1 s poll), their ends recorded, the claim made
  stubborn   the same with jobs that ignore the signal: the grace (2 s here), SIGTERM, then
             the same; what is left over the grace is gpuclaim's own
  queued     ``run --queue`` of a 1-GPU job until it runs (the pass that queued it asks the
             job to yield, the yielding job's wrapper starts it)

Medians of ``--repeat`` rounds, each with fresh preemptible jobs. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sweep import REPO, Cli

sys.path.insert(0, str(REPO / "tests"))
from testbed import Testbed

COOPERATIVE = (
    "import signal, sys, time; signal.signal(signal.SIGUSR1, lambda n, f: sys.exit(0));"
    " time.sleep(600)"
)
STUBBORN = "import signal, time; signal.signal(signal.SIGUSR1, lambda n, f: None); time.sleep(600)"
GRACE_S = 2


def _running(cli: Cli, count: int) -> None:
    deadline = time.monotonic() + 60
    while sum(s == "running" for s in cli.states()) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{count} jobs did not start within a minute")
        time.sleep(0.1)
    time.sleep(0.5)  # their signal handlers are set


def _fill(cli: Cli, code: str, round_: int) -> None:
    for i in range(4):
        cli("run", "--preemptible", "--name", f"s{round_}-{i}", "-q", "--", "python3", "-c", code)
    _running(cli, 4)


def _clear(cli: Cli) -> None:
    rows = json.loads(cli("jobs", "--json"))
    for r in rows:
        if r["state"] in ("running", "starting", "queued"):
            cli("kill", r["id"])
    claims = json.loads(cli("status", "--json"))
    if any(r["claim"] and not r["claim"]["job"] for r in claims):
        cli("release", "--all", "-q")
    deadline = time.monotonic() + 60
    while any(s in ("running", "starting") for s in cli.states()):
        if time.monotonic() > deadline:
            raise SystemExit("jobs did not stop within a minute")
        time.sleep(0.1)


def _timed_claim(cli: Cli) -> float:
    t0 = time.perf_counter()
    cli("claim", "-n", "2", "--time", "10m", "-q")
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tb = Testbed.up(1, gpus=4)
    results: dict[str, list[float]] = {"free": [], "handover": [], "stubborn": [], "queued": []}
    try:
        with tempfile.TemporaryDirectory(prefix="gpuclaim-preempt-") as tmp:
            cli = Cli(Path(tmp), tb, tb.nodes)
            with (Path(cli.env["GPUCLAIM_CONFIG"])).open("a") as config:
                config.write(f'\n[queue]\npreempt_grace = "{GRACE_S}s"\n')
            cli("status", "--json")  # the agent goes to the node once
            for round_ in range(args.repeat):
                results["free"].append(_timed_claim(cli))
                _clear(cli)
                _fill(cli, COOPERATIVE, round_)
                results["handover"].append(_timed_claim(cli))
                _clear(cli)
                _fill(cli, STUBBORN, round_ + 100)
                results["stubborn"].append(_timed_claim(cli))
                _clear(cli)
                _fill(cli, COOPERATIVE, round_ + 200)
                t0 = time.perf_counter()
                cli("run", "--queue", "--name", f"q{round_}", "-q", "--", "sleep", "600")
                while not any(
                    r["name"] == f"q{round_}" and r["state"] == "running"
                    for r in (
                        json.loads(p.read_text()) for p in (cli.store / "jobs").glob("*.json")
                    )
                ):
                    if time.perf_counter() - t0 > 60:
                        raise SystemExit("the queued job did not start within a minute")
                    time.sleep(0.05)
                results["queued"].append(time.perf_counter() - t0)
                _clear(cli)
    finally:
        tb.down()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"preemption on 1 node x 4 GPUs, {os.cpu_count()} CPUs, median of {args.repeat}")
    print(f"  claim -n 2, GPUs free:                      {med['free']:.2f} s")
    print(
        f"  claim -n 2 from jobs that save and exit:    {med['handover']:.2f} s"
        f" ({med['handover'] - med['free']:.2f} s more)"
    )
    print(
        f"  claim -n 2 from jobs that ignore the signal: {med['stubborn']:.2f} s"
        f" (grace {GRACE_S} s; beyond grace + a claim:"
        f" {med['stubborn'] - GRACE_S - med['free']:.2f} s)"
    )
    print(f"  run --queue until it runs (job yields):    {med['queued']:.2f} s")
    print(json.dumps({k: round(v, 3) for k, v in med.items()}))


if __name__ == "__main__":
    main()
