#!/usr/bin/env python3
"""gpuclaim's own cost, next to GPU reads as fast as real ones: for each cost of a fake
``nvidia-smi`` (``smi_cost.py``: 5 ms, a small node with persistence mode; 50 ms; 2 s, a node
without it), the three ratios [fast-2] asks for, in one run on the sshd testbed.

    python bench/gpu_read_costs.py [--costs 5,50,2000] [--nodes 1,4,16] [--repeat 3]

  warm / pdsh    ``status --json`` with masters and warm agents up, against pdsh running the
                 two nvidia-smi queries a look needs (targets: <= 0.15 at N=16); warm-read:
                 the same with every look reading the GPUs (``gpu_read_max_age = 0``)
  first / pdsh   the first call of the day (no masters, no agents) against pdsh
                 (target: <= 1.0 at N=4 and 16); py-floor: a Python program that only
                 runs pdsh's ssh commands, the least any Python CLI could take
  run / hand     plain ``run`` until the job's first output, against ``ssh node tmux new -d``
                 (target: <= 1.5 at N=1); and ``run --follow`` until it prints it
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def _json(script: str, *args: str) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    print(f"  {script} {' '.join(args)}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--costs", default="5,50,2000", help="nvidia-smi costs, in ms")
    ap.add_argument("--nodes", default="1,4,16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if shutil.which("pdsh") is None:
        raise SystemExit("pdsh is the baseline here: apt-get install pdsh")
    rows = []
    for cost in [float(c) for c in args.costs.split(",")]:
        fan = _json(
            "fanout.py", "--nodes", args.nodes, "--repeat", str(args.repeat),
            "--smi-cost", f"{cost:g}", "--lean",
        )  # fmt: skip
        job = _json("jobstart.py", "--repeat", str(args.repeat), "--smi-cost", f"{cost:g}")
        rows.append({"cost_ms": cost, "fanout": fan["table"], "job": job})
    if args.json:
        print(json.dumps(rows))
        return
    print(
        "\nnvidia-smi  N     pdsh    warm  warm/pdsh   first  first/pdsh  warm-read  warm-read/pdsh"
        "  py-floor/pdsh"
    )
    for row in rows:
        for n, t in row["fanout"].items():
            print(
                f"{row['cost_ms']:>8g}ms {n:>3} {t['pdsh']:>8.3f} {t['warm']:>7.3f} "
                f"{t['warm'] / t['pdsh']:>10.2f} {t['first']:>7.3f} {t['first'] / t['pdsh']:>11.2f}"
                f" {t['warm-read']:>10.3f} {t['warm-read'] / t['pdsh']:>15.2f}"
                f" {t['py-floor'] / t['pdsh']:>14.2f}"
            )
    print("\nnvidia-smi  by hand  run (plain)  ratio  run --follow  ratio   (N=1)")
    for row in rows:
        j = row["job"]
        print(
            f"{row['cost_ms']:>8g}ms {j['by_hand_s']:>8.3f} {j['plain_s']:>12.3f} "
            f"{j['plain_ratio']:>6.2f} {j['gpuclaim_s']:>13.3f} {j['ratio']:>6.2f}"
        )
    print("(targets: warm/pdsh <= 0.15 at N=16; first/pdsh <= 1.0 at N=4, 16; run <= 1.5)")


if __name__ == "__main__":
    main()
