#!/usr/bin/env python3
"""Job start: from ``gpuclaim run --follow`` to the job's first line on the user's terminal,
against doing it by hand with ``ssh node tmux new -d`` (same testbed node, same run).

    python bench/jobstart.py [--repeat 5] [--client openssh|fabric] [--smi-cost MS]

By hand: ``ssh node 'tmux new -d ...'`` until the job's output file (read here, on the shared
disk: the fastest a user could ever see it). gpuclaim: a new CLI process, as typed, until
``run --follow`` prints the job's first line; its path includes what the hand path skips:
probing the GPUs, an atomic claim, the wrapper's log and heartbeat, carrying the line back.
``--client openssh`` (the default here) after a warm-up: masters and warm agents up.
Measured both ways: plain ``run`` (it returns once the job is launched) until the job's own
first output is in its file, like the hand path; and ``run --follow`` until it prints it.
``--smi-cost MS``: a fake nvidia-smi of that fixed cost instead of the simulator's NVML
(``smi_cost.py``).
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from smi_cost import install  # noqa: E402
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


def follow_first_line(argv: list[str], env: dict[str, str]) -> float:
    """Seconds from starting ``argv`` until it prints a line with "started"; waits for it."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    took = None
    for line in proc.stdout:
        if b"started" in line:
            took = time.perf_counter() - t0
            break
    _, err = proc.communicate(timeout=60)
    if took is None or proc.returncode != 0:
        raise SystemExit(f"gpuclaim run --follow failed: {err.decode()[-300:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--client", choices=("openssh", "fabric"), default="openssh")
    ap.add_argument("--json", action="store_true", help="Print one JSON line.")
    ap.add_argument("--smi-cost", type=float, default=None, metavar="MS")
    args = ap.parse_args()
    compileall.compile_dir(str(REPO / "gpuclaim"), quiet=1)  # as installed (see fanout.py)
    tb = Testbed.up(1, gpus=4, nvml=args.smi_cost is None)
    if args.smi_cost is not None:
        install(tb, args.smi_cost)
    runtime = Path(tempfile.mkdtemp(prefix="gcj-", dir="/tmp"))  # short socket paths
    try:
        with tempfile.TemporaryDirectory(prefix="gcbench-") as tmp:
            work = Path(tmp)
            config = work / "config.toml"
            (work / "store").mkdir()  # as an admin makes a store's directory
            text = render_config(
                cluster="bench",
                nodes=tb.nodes,
                storage=str(work / "store"),
                ssh_config=str(tb.ssh_config),
            )
            # named either way: the default ("auto") is the ssh binary where there is one
            client = f'\nssh_client = "{args.client}"\nnodes = '
            text = text.replace("\nnodes = ", client, 1)
            config.write_text(text)
            env = {
                **os.environ,
                "GPUCLAIM_CONFIG": str(config),
                "GPUCLAIM_HOME": str(work),
                "XDG_RUNTIME_DIR": str(runtime),
            }
            gpuclaim = [sys.executable, "-m", "gpuclaim"]
            for _ in range(2):  # agent sent; master and warm agent up
                subprocess.run([*gpuclaim, "status"], env=env, capture_output=True)
            by_hand, ours, plain = [], [], []
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
                job = ["sh", "-c", "echo started; sleep 1"]
                ours.append(
                    follow_first_line(
                        [*gpuclaim, "run", "--follow", "--name", f"b{i}", "--", *job], env
                    )
                )
                out = tb.node_dir("node01") / "home" / f"plain{i}.log"
                t0 = time.perf_counter()
                # the job's output, not the CLI's end (run watches the job's first moment)
                launcher = subprocess.Popen(
                    [*gpuclaim, "run", "--name", f"p{i}", "--", "sh", "-c",
                     f"echo started > {out}; sleep 1"],
                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                )  # fmt: skip
                wait_for(out, "started")
                plain.append(time.perf_counter() - t0)
                if launcher.wait(60) != 0:
                    raise SystemExit(f"gpuclaim run failed: {launcher.stderr.read()[-300:]!r}")
                time.sleep(1.2)  # the jobs end: the next run has the GPUs back
    finally:
        tb.down()
        shutil.rmtree(runtime, ignore_errors=True)
    hand, mine = statistics.median(by_hand), statistics.median(ours)
    run_plain = statistics.median(plain)
    if args.json:
        import json

        print(
            json.dumps(
                {
                    "by_hand_s": hand,
                    "gpuclaim_s": mine,
                    "ratio": mine / hand,
                    "plain_s": run_plain,
                    "plain_ratio": run_plain / hand,
                    "smi_cost_ms": args.smi_cost,
                }
            )
        )
        return
    print(
        f"\njob start to first output line, median of {args.repeat} "
        f"({os.cpu_count()} CPUs, {args.client})"
    )
    print(f"ssh node tmux new -d (by hand)  {hand:.3f} s")
    print(f"gpuclaim run --follow           {mine:.3f} s   ratio {mine / hand:.2f}")
    print(f"gpuclaim run (plain)            {run_plain:.3f} s   ratio {run_plain / hand:.2f}")
    print("(targets: ratio <= 1.5)")


if __name__ == "__main__":
    main()
