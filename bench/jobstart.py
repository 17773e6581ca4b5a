#!/usr/bin/env python3
"""Job start: from ``gpuclaim run`` to the job's first line of output, against doing it by hand
with ``ssh node tmux new -d`` (same testbed node, same run).

    python bench/jobstart.py [--repeat 5]

gpuclaim's path includes what the hand path skips: probing the GPUs, an atomic claim, the
wrapper checking GPU UUIDs, the log and the heartbeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from testbed import Testbed  # noqa: E402

from gpuclaim.app.configfile import render_config  # noqa: E402


def wait_for(path: Path, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if text in path.read_text():
                return
        except OSError:
            pass
        time.sleep(0.005)
    raise SystemExit(f"{text!r} never appeared in {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="Print one JSON line.")
    args = ap.parse_args()
    tb = Testbed.up(1, gpus=4)
    try:
        with tempfile.TemporaryDirectory(prefix="gcbench-") as tmp:
            work = Path(tmp)
            config = work / "config.toml"
            (work / "store").mkdir()  # as an admin makes a store's directory
            config.write_text(
                render_config(
                    cluster="bench",
                    nodes=tb.nodes,
                    storage=str(work / "store"),
                    ssh_config=str(tb.ssh_config),
                )
            )
            env = {**os.environ, "GPUCLAIM_CONFIG": str(config), "GPUCLAIM_HOME": str(work)}
            gpuclaim = [sys.executable, "-m", "gpuclaim"]
            subprocess.run([*gpuclaim, "status"], env=env, capture_output=True)  # agent cached
            jobs_dir = tb.node_dir("node01") / "home" / ".gpuclaim" / "jobs"
            by_hand, ours = [], []
            for i in range(args.repeat):
                out = tb.node_dir("node01") / "home" / f"hand{i}.log"
                t0 = time.perf_counter()
                subprocess.run(
                    [
                        "ssh",
                        "-F",
                        str(tb.ssh_config),
                        "node01",
                        f"CUDA_VISIBLE_DEVICES=0 tmux new-session -d -s hand{i} "
                        f"'echo started > {out}; sleep 1'",
                    ],
                    check=True,
                )
                wait_for(out, "started")
                by_hand.append(time.perf_counter() - t0)

                t0 = time.perf_counter()
                proc = subprocess.run(
                    [*gpuclaim, "run", "--name", f"b{i}", "--json", "--", "echo", "started"],
                    env=env,
                    capture_output=True,
                    text=True,
                )
                if proc.returncode != 0:
                    raise SystemExit(proc.stderr)
                job_id = proc.stdout.split('"id": "', 1)[1].split('"', 1)[0]
                wait_for(jobs_dir / job_id / "rank0" / "output.log", "started")
                ours.append(time.perf_counter() - t0)
                time.sleep(1.5)  # let the job end and release its GPU
    finally:
        tb.down()
    hand, mine = statistics.median(by_hand), statistics.median(ours)
    if args.json:
        import json

        print(json.dumps({"by_hand_s": hand, "gpuclaim_s": mine, "ratio": mine / hand}))
        return
    print(f"\njob start to first output, median of {args.repeat} ({os.cpu_count()} CPUs)")
    print(f"ssh node tmux new -d (by hand)  {hand:.3f} s")
    print(f"gpuclaim run                    {mine:.3f} s")
    print(f"ratio gpuclaim / by hand        {mine / hand:.2f}")


if __name__ == "__main__":
    main()
