#!/usr/bin/env python3
"""Start-up and memory: `gpuclaim --help` and `gpuclaim status` (local mode) against
`python -c pass`, and the peak RSS of `status` and of the board over a 32-node testbed.

    python bench/startup.py [--repeat 10] [--nodes 32]
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


def timed(argv: list[str], env: dict[str, str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def peak_rss_mib(argv: list[str], env: dict[str, str]) -> float:
    """Peak RSS of one command run alone (ru_maxrss of the largest child so far)."""
    code = (
        "import resource,subprocess,sys,json;"
        "subprocess.run(json.loads(sys.argv[1]),stdout=subprocess.DEVNULL,"
        "stderr=subprocess.DEVNULL);"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(argv)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=32)
    args = ap.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="gcbench-") as tmp:
        env = {**os.environ, "GPUCLAIM_HOME": tmp}
        env.pop("GPUCLAIM_CONFIG", None)
        result = {
            "python_pass_s": timed([py, "-c", "pass"], env, args.repeat),
            "help_s": timed([py, "-m", "gpuclaim", "--help"], env, args.repeat),
            "status_local_s": timed([py, "-m", "gpuclaim", "status"], env, args.repeat),
        }
        tb = Testbed.up(args.nodes, gpus=8)
        try:
            config = Path(tmp) / "config.toml"
            (Path(tmp) / "store").mkdir(exist_ok=True)  # as an admin makes a store's directory
            config.write_text(
                render_config(
                    cluster="bench",
                    nodes=tb.nodes,
                    storage=str(Path(tmp) / "store"),
                    ssh_config=str(tb.ssh_config),
                )
            )
            genv = {**env, "GPUCLAIM_CONFIG": str(config)}
            subprocess.run([py, "-m", "gpuclaim", "status"], env=genv, capture_output=True)
            result["status_rss_mib"] = peak_rss_mib(
                [py, "-m", "gpuclaim", "status", "--json"], genv
            )
            svg = Path(tmp) / "board.svg"
            result["board_rss_mib"] = peak_rss_mib(
                [py, "-m", "gpuclaim", "board", "--svg", str(svg)], genv
            )
        finally:
            tb.down()
    result["help_minus_floor_ms"] = round((result["help_s"] - result["python_pass_s"]) * 1000)
    result["status_minus_floor_ms"] = round(
        (result["status_local_s"] - result["python_pass_s"]) * 1000
    )
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
