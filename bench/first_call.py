#!/usr/bin/env python3
"""The first call of the day, measured fairly: ``gpuclaim status --json`` with no master, no
warm agent and no agent installed on the nodes, against the py-floor (a Python program that
only spawns the same ssh commands pdsh runs) and against pdsh, at N nodes and RTTs.

    python bench/first_call.py [--nodes 4,16] [--rtt 0,1,20] [--repeat 5] [--smi-cost 5]

Each RTT is one run of ``bench/fanout.py --lean --json`` (the testbed's delay proxy gives
the RTT; pdsh, py-floor and the first calls take turns in one loop, so machine noise falls
on all of them). The nodes' nvidia-smi is a fake of fixed cost (``--smi-cost`` ms, as fast
as a real one), for pdsh and gpuclaim alike. Goals (issue [hardening-4]): first <= 1.05x
py-floor at every point, first <= 1.10x pdsh at 1 and 20 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLOOR_GOAL = 1.05
PDSH_GOAL = 1.10
PDSH_GOAL_RTTS = (1, 20)


def one_rtt(rtt: int, nodes: str, repeat: int, smi_cost: float) -> dict[str, dict[str, float]]:
    argv = [sys.executable, str(HERE / "fanout.py"), "--lean", "--json", "--nodes", nodes]
    argv += ["--repeat", str(repeat), "--delay-ms", str(rtt), "--smi-cost", str(smi_cost)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"fanout.py at RTT {rtt} ms failed:\n{proc.stderr[-3000:]}")
    last = proc.stdout.strip().splitlines()[-1]
    table = json.loads(last)["table"]
    return {str(n): row for n, row in table.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="4,16")
    ap.add_argument("--rtt", default="0,1,20", help="RTTs in ms, through the delay proxy")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--smi-cost", type=float, default=5.0, metavar="MS")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rtts = [int(r) for r in args.rtt.split(",")]
    results = {rtt: one_rtt(rtt, args.nodes, args.repeat, args.smi_cost) for rtt in rtts}
    if args.json:
        print(json.dumps({"smi_cost_ms": args.smi_cost, "repeat": args.repeat, "rtt": results}))
        return
    print(
        f"first call, median of {args.repeat}, seconds ({os.cpu_count()} CPUs, "
        f"nvidia-smi {args.smi_cost:g} ms)"
    )
    head = f"{'RTT':>5} {'N':>3} {'pdsh':>7} {'py-floor':>9} {'first':>7}"
    print(head + f" {'first/floor':>12} {'goal':>5} {'first/pdsh':>11} {'goal':>5}")
    met = total = 0
    for rtt, table in results.items():
        for n, row in table.items():
            floor_ratio = row["first"] / row["py-floor"]
            pdsh_ratio = row["first"] / row["pdsh"] if "pdsh" in row else float("nan")
            floor_ok = floor_ratio <= FLOOR_GOAL
            pdsh_ok = pdsh_ratio <= PDSH_GOAL if rtt in PDSH_GOAL_RTTS else None
            met += floor_ok + bool(pdsh_ok)
            total += 1 + (pdsh_ok is not None)
            pdsh_mark = "-" if pdsh_ok is None else ("yes" if pdsh_ok else "NO")
            print(
                f"{rtt:>3}ms {n:>3} {row.get('pdsh', float('nan')):>7.3f} {row['py-floor']:>9.3f}"
                f" {row['first']:>7.3f} {floor_ratio:>11.2f}x {'yes' if floor_ok else 'NO':>5}"
                f" {pdsh_ratio:>10.2f}x {pdsh_mark:>5}"
            )
    print(f"goals met: {met} of {total}")


if __name__ == "__main__":
    main()
