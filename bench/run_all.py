#!/usr/bin/env python3
"""The whole benchmark suite in one command (under 10 minutes on 2 cores): gpuclaim against
the plain tools, measured side by side in the same run, as one table of medians and ratios.

    python bench/run_all.py [--quick]

Each part is its own script (run them alone for details): startup.py, claims.py, fanout.py,
jobstart.py, board.py, sync.py, sweep.py, shares.py. Machines are noisy: read the ratios,
never a lone absolute time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def run(script: str, *args: str) -> str:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    print(f"  {script} {' '.join(args)}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return proc.stdout


def last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Fewer repeats and sizes.")
    args = ap.parse_args()
    rep = "2" if args.quick else "3"
    sizes = "1,4,16" if args.quick else "1,4,16,32"
    t0 = time.monotonic()
    print("running (each part also runs alone from bench/):", file=sys.stderr)
    startup = last_json(run("startup.py", "--repeat", "5" if args.quick else "10", "--nodes", "32"))
    claims = last_json(run("claims.py", "--seconds", "5" if args.quick else "8"))
    direct = last_json(run("fanout.py", "--nodes", sizes, "--repeat", rep, "--json"))
    delayed = last_json(
        run("fanout.py", "--nodes", "1,16", "--repeat", rep, "--delay-ms", "30", "--json")
    )
    jobs = last_json(run("jobstart.py", "--repeat", "3" if args.quick else "5", "--json"))
    board = run("board.py", "--repeat", "10", "--idle", "10", "--transport", "ssh", "--nodes", "16")
    synced = last_json(run("sync.py", "--repeat", "2" if args.quick else "3", "--json"))
    swept = last_json(run("sweep.py", "--finished", "3000" if args.quick else "10000"))
    shared = last_json(run("shares.py", "--cli-repeat", "10" if args.quick else "30"))
    total = time.monotonic() - t0

    print(
        f"# gpuclaim benchmarks — {platform.node()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}\n"
    )
    print(
        "## 1. Cluster view fan-out (median seconds; `status --json`, a new process each time; "
        "pdsh runs the two nvidia-smi queries a look needs)\n"
    )
    for label, data in (("loopback", direct), ("30 ms RTT", delayed)):
        table = data["table"]
        ns = list(table)
        methods = list(next(iter(table.values())))
        print(f"{label:<10}" + "".join(f"{'N=' + n:>10}" for n in ns))
        for m in methods:
            print(f"{m:<10}" + "".join(f"{table[n][m]:>10.3f}" for n in ns))
        first, last = ns[0], ns[-1]
        for m, target in (("warm", 0.30), ("first", 1.0)):
            vs = ", ".join(
                f"N={n} {table[n][m] / table[n]['pdsh']:.2f}" for n in ns if "pdsh" in table[n]
            )
            print(f"  {m} / pdsh: {vs}   (target <= {target})")
        print(
            f"  warm N={last} / warm N={first}: {table[last]['warm'] / table[first]['warm']:.2f}\n"
        )
    print("## 2. Start-up (median seconds)\n")
    print(
        f"python -c pass {startup['python_pass_s']:.3f}   gpuclaim --help {startup['help_s']:.3f}"
        f" (+{startup['help_minus_floor_ms']} ms, target <= +150)   status, local mode "
        f"{startup['status_local_s']:.3f} (+{startup['status_minus_floor_ms']} ms)\n"
    )
    print("## 3. Claims (local store)\n")
    print(
        f"claim+release: store {claims['claim_release_store_ms']} ms, whole CLI step "
        f"{claims['claim_release_cli_ms']} ms; {claims['workers']} racing processes: "
        f"{claims['racing_claims_per_s']} claims/s, {claims['racing_lost_races']} lost races, "
        f"double holders {claims['double_holders']} (must be 0)\n"
    )
    print("## 4. Job start (run --follow → the job's first line on the terminal)\n")
    print(
        f"ssh node tmux new -d (by hand) {jobs['by_hand_s']:.3f} s, gpuclaim run --follow "
        f"{jobs['gpuclaim_s']:.3f} s, ratio {jobs['ratio']:.2f} (target <= 1.5)\n"
    )
    print("## 5. Board\n")
    print(board.strip() + "\n")
    print("## 6. Memory (peak RSS, 32 nodes)\n")
    print(f"status {startup['status_rss_mib']:.0f} MiB, board {startup['board_rss_mib']:.0f} MiB\n")
    print("## 7. run --sync (2,000 files, 200 MB) against plain rsync over the same master\n")
    print(
        f"first: rsync {synced['rsync first']:.3f} s, sync {synced['sync first']:.3f} s "
        f"({synced['sync first'] / synced['rsync first']:.2f}x); incremental: rsync "
        f"{synced['rsync incr']:.3f} s, sync {synced['sync incr']:.3f} s "
        f"({synced['sync incr'] / synced['rsync incr']:.2f}x, target <= 1.2); whole run "
        f"{synced['run incr']:.3f} s\n"
    )
    print("## 8. Arrays (2 nodes x 4 GPUs): 96 tasks of 2 s, 1,000 queued, finished history\n")
    m, d, h = swept["makespan"], swept["dispatch"], swept["history"]
    print(
        f"makespan {m['makespan_s']:.1f} s against an ideal {m['ideal_s']:.1f} s "
        f"({m['ratio']:.2f}x, target <= 2.5); a dispatch pass with 1,000 queued "
        f"{d['pass_s'] * 1000:.0f} ms; jobs --json with the finished history "
        f"{h['jobs_10000_s']:.2f} s (empty {h['jobs_empty_s']:.2f} s)\n"
    )
    print("## 9. Shares of a GPU (--gpu-mem) against whole GPUs, interleaved\n")
    print(
        f"claim+release, store: share {shared['store_share_ms']} ms, whole "
        f"{shared['store_whole_ms']} ms ({shared['store_ratio']}x); whole CLI step: share "
        f"{shared['cli_share_ms']} ms, whole {shared['cli_whole_ms']} ms "
        f"({shared['cli_ratio']}x, target <= 1.1)\n"
    )
    print(f"(whole suite: {total:.0f} s)")


if __name__ == "__main__":
    main()
