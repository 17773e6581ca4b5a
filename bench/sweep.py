#!/usr/bin/env python3
"""[sweeps] at scale, on the sshd testbed (2 nodes x 4 GPUs, real tmux):

    python bench/sweep.py [--tasks 96] [--seconds 2] [--queued 1000] [--finished 10000]

  makespan   ``run --array 0-95`` of 2 s tasks until the last one ended, nobody calling
             gpuclaim meanwhile, against the ideal (tasks x seconds / GPUs)
  submit     how long ``run --array`` takes to return
  dispatch   one dispatch pass (``jobs --json``, which dispatches first, and the engine's pass
             alone, in-process) with 1,000 tasks queued behind full GPUs, against none
  history    ``status --json`` and ``jobs --json`` with 10,000 jobs that ended days ago in
             the store (the first look archives them), against an empty store; and
             ``jobs --json`` with 10,000 more that ended an hour ago (still live)

Machines are noisy: read the ratios. The last line is JSON for run_all.py.
"""

from __future__ import annotations

import argparse
import json
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
from gpuclaim.core.model import Job, JobRank  # noqa: E402

TASK = "import time, sys; time.sleep(float(sys.argv[1]))"


class Cli:
    def __init__(self, work: Path, tb: Testbed, nodes: list[str]) -> None:
        (work / "store").mkdir(mode=0o2775)
        (work / "home").mkdir()
        self.store = work / "store"
        config = work / "config.toml"
        config.write_text(
            render_config(
                cluster="bench",
                nodes=nodes,
                storage=str(self.store),
                ssh_config=str(tb.ssh_config),
                defaults={"heartbeat": "1s", "kill_grace": "2s"},
            )
        )
        self.env = {
            **os.environ,
            **tb.env(delayed=False),
            "GPUCLAIM_CONFIG": str(config),
            "GPUCLAIM_HOME": str(work / "home"),
            "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="gcs-", dir="/tmp"),
            "USER": "alice",
        }

    def __call__(self, *args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuclaim", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise SystemExit(f"gpuclaim {' '.join(args)}: {proc.stderr.strip()[:300]}")
        return proc.stdout

    def timed(self, *args: str, repeat: int = 5) -> float:
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            self(*args)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    def states(self) -> list[str]:
        return [json.loads(p.read_text())["state"] for p in (self.store / "jobs").glob("*.json")]


def makespan(cli: Cli, tasks: int, seconds: float) -> dict[str, float]:
    t0 = time.monotonic()
    cli(
        "run",
        "--array",
        f"0-{tasks - 1}",
        "--name",
        "mk",
        "-q",
        "--",
        "python3",
        "-c",
        TASK,
        str(seconds),
    )
    submit = time.monotonic() - t0
    while sum(s == "succeeded" for s in cli.states()) < tasks:  # reading files: no dispatch
        if time.monotonic() - t0 > 600:
            raise SystemExit("the array did not finish in 10 minutes")
        time.sleep(0.2)
    span = time.monotonic() - t0
    ideal = tasks * seconds / 8
    return {"submit_s": submit, "makespan_s": span, "ideal_s": ideal, "ratio": span / ideal}


def dispatch(cli: Cli, queued: int) -> dict[str, float]:
    empty = cli.timed("jobs", "--json")
    cli("claim", "-n", "4", "--node", "node01", "--time", "1h", "-q")
    cli("claim", "-n", "4", "--node", "node02", "--time", "1h", "-q")
    t0 = time.monotonic()
    cli("run", "--array", f"0-{queued - 1}", "--name", "deep", "-q", "--", "true")
    submit = time.monotonic() - t0
    full = cli.timed("jobs", "--json")
    status = cli.timed("status", "--json")
    code = (
        "import time, sys; from gpuclaim.app.configfile import load_config;"
        " from gpuclaim.app.wiring import make_prober, open_store;"
        " from gpuclaim.engine.dispatch import dispatch_queue;"
        " c = load_config(None); p = make_prober(c); s = open_store(c, p);"
        " dispatch_queue(c, s, p); t = time.perf_counter();"
        " [dispatch_queue(c, s, p) for _ in range(5)];"
        " print((time.perf_counter() - t) / 5)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=cli.env, capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-500:])
    cli("kill", "deep", "-q")
    cli("release", "--all", "-q")
    return {
        "submit_1000_s": submit,
        "jobs_empty_s": empty,
        "jobs_1000_queued_s": full,
        "status_1000_queued_s": status,
        "pass_s": float(proc.stdout.strip().splitlines()[-1]),
    }


def _finished_records(cli: Cli, count: int, ended_ago_s: float, prefix: str) -> None:
    now = time.time() - ended_ago_s
    for i in range(count):  # records as the wrappers leave them: ended, with a rank
        job = Job(
            id=f"j-{prefix}{i:06d}",
            name=f"{prefix}-{i}",
            user="alice" if i % 3 else "bob",
            argv=("python3", "train.py", "--seed", str(i)),
            state="succeeded" if i % 10 else "failed",
            submitted=now - 60 - count + i,
            time_limit_s=3600,
            started=now - 59 - count + i,
            ended=now - count + i,
            exit_code=0 if i % 10 else 1,
            ranks=(JobRank(0, "node01", (i % 4,), (f"GPU-{i % 4}",), f"c-{i}", "succeeded"),),
        )
        (cli.store / "jobs" / f"{job.id}.json").write_text(json.dumps(job.to_dict()))


def history(cli: Cli, finished: int) -> dict[str, float]:
    """10,000 jobs that ended days ago: the first look moves them to the archive (once), every
    later look reads only what is live. Then 10,000 that ended today (shown by `jobs`)."""
    before = {"status": cli.timed("status", "--json"), "jobs": cli.timed("jobs", "--json")}
    _finished_records(cli, finished, 3 * 86400, "old")
    first = cli.timed("jobs", "--json", repeat=1)  # moves them
    after = {"status": cli.timed("status", "--json"), "jobs": cli.timed("jobs", "--json")}
    every = cli.timed("jobs", "--all", "--json")
    _finished_records(cli, finished, 3600, "today")
    today = cli.timed("jobs", "--json")
    return {
        "status_empty_s": before["status"],
        "status_10000_s": after["status"],
        "jobs_empty_s": before["jobs"],
        "jobs_first_look_s": first,
        "jobs_10000_s": after["jobs"],
        "jobs_all_10000_s": every,
        "jobs_10000_today_s": today,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=96)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--finished", type=int, default=10000)
    args = parser.parse_args()
    tb = Testbed.up(2, gpus=4)
    try:
        with tempfile.TemporaryDirectory(prefix="gpuclaim-sweep-") as tmp:
            cli = Cli(Path(tmp), tb, tb.nodes)
            cli("status", "--json")  # the agents go to the nodes once
            results = {
                "makespan": makespan(cli, args.tasks, args.seconds),
                "dispatch": dispatch(cli, args.queued),
                "history": history(cli, args.finished),
            }
    finally:
        tb.down()
    m, d, h = results["makespan"], results["dispatch"], results["history"]
    print(f"sweep on 2 nodes x 4 GPUs, {os.cpu_count()} CPUs")
    print(
        f"  {args.tasks} tasks of {args.seconds:g} s: makespan {m['makespan_s']:.1f} s, ideal"
        f" {m['ideal_s']:.1f} s: {m['ratio']:.2f}x (target <= 2.5x); run returned in"
        f" {m['submit_s']:.1f} s"
    )
    print(
        f"  {args.queued} queued: run --array took {d['submit_1000_s']:.1f} s; a dispatch pass"
        f" {d['pass_s'] * 1000:.0f} ms; jobs --json {d['jobs_1000_queued_s']:.2f} s (empty queue"
        f" {d['jobs_empty_s']:.2f} s); status --json {d['status_1000_queued_s']:.2f} s"
    )
    print(
        f"  {args.finished} jobs ended days ago: status --json {h['status_10000_s']:.2f} s (empty"
        f" {h['status_empty_s']:.2f} s); jobs --json {h['jobs_10000_s']:.2f} s (empty"
        f" {h['jobs_empty_s']:.2f} s; the first look, which archives them:"
        f" {h['jobs_first_look_s']:.2f} s); jobs --all --json {h['jobs_all_10000_s']:.2f} s"
    )
    print(
        f"  + {args.finished} ended an hour ago (live, 2/3 of them listed): jobs --json"
        f" {h['jobs_10000_today_s']:.2f} s"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
