#!/usr/bin/env python3
"""The board's cost: one refresh of a big cluster, and the CPU it burns while idle.

    python bench/board.py [--nodes 32] [--gpus 8] [--repeat 20] [--idle 20] [--refresh 2]
                          [--transport ssh,local]

  build     read_board(): one store read joined with every node's latest probe (the real
            store, ~1/3 of the GPUs claimed, synthetic inventories), median of --repeat;
            +idle: with the idle-claim sampling the board does every 30 s
  render    the table of the headless app at 200×60: a full rebuild, a refresh where nothing
            changed, and one where ~10% of the GPUs changed (the usual case), median
  text      render_text() of the same data (``board --once``)
  idle CPU  the real ``gpuclaim board`` in a real terminal (a private tmux server), refreshing
            every --refresh seconds for --idle seconds against NODES × GPUS simulated GPUs:
              ssh    real sshd nodes (the testbed) over the board's persistent connections
              local  local nodes, each probe a fake nvidia-smi process (children counted)
            CPU seconds of the board process (and its children) over wall seconds, in %.
Machines are noisy (2 shared cores here): read the orders of magnitude.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from cputime import machine_cpu  # noqa: E402
from test_board_snapshots import services_for, synthetic_cluster  # noqa: E402

from gpuclaim.app.configfile import render_config  # noqa: E402
from gpuclaim.board.app import make_app  # noqa: E402
from gpuclaim.board.cells import CellMemo  # noqa: E402
from gpuclaim.board.data import NodeSample, read_board  # noqa: E402
from gpuclaim.board.text import render_text  # noqa: E402


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


def bench_refresh(nodes: int, gpus: int, repeat: int, work: Path) -> dict[str, float]:
    cluster = synthetic_cluster(work / "synthetic", nodes, gpus)
    services = services_for(cluster)
    samples = {
        name: NodeSample(inv, 0.0, 0.0, 0.0) for name, inv in cluster.prober.inventories.items()
    }
    results = {
        "build": median_ms(lambda: read_board(services, samples, False), repeat),
        "build+idle": median_ms(lambda: read_board(services, samples, True), repeat),
    }
    data = read_board(services, samples)
    results["text"] = median_ms(lambda: render_text(data, "alice", "lab", 200), repeat)
    results.update(asyncio.run(_render_times(services, data, samples, repeat)))
    results["gpus"] = sum(len(i.gpus) for i in cluster.prober.inventories.values())
    results["claims"] = len(data.view.snapshot.claims)
    return results


async def _render_times(services: Any, data: Any, samples: Any, repeat: int) -> dict[str, float]:
    app = make_app(services)
    async with app.run_test(size=(200, 60)) as pilot:
        await app.loaded.wait()
        await pilot.pause()

        def full() -> None:
            app.table.show([], [])  # forget the table and the cells: a rebuild from scratch
            app._memo = CellMemo()
            app.data = data
            app._render()

        def unchanged() -> None:
            app.data = data
            app._render()

        changed = [_changed(data, samples, services, k) for k in range(repeat)]
        turn = iter(changed * 2)

        def some_changed() -> None:
            app.data = next(turn)
            app._render()

        return {
            "render full": median_ms(full, repeat),
            "render same": median_ms(unchanged, repeat),
            "render 10%": median_ms(some_changed, repeat),
        }


def _changed(data: Any, samples: dict[str, NodeSample], services: Any, k: int) -> Any:
    """The same cluster with every tenth GPU's memory and utilisation moved."""
    moved = {}
    for name, sample in samples.items():
        gpus = tuple(
            replace(g, utilization_pct=(k * 7 + g.index) % 100, memory_used_mib=1024 * (k + 1))
            if (g.index + k) % 10 == 0
            else g
            for g in sample.inventory.gpus
        )
        moved[name] = replace(sample, inventory=replace(sample.inventory, gpus=gpus))
    return read_board(services, moved)


def bench_idle(
    transport: str, nodes: int, gpus: int, seconds: float, refresh: float, work: Path
) -> dict[str, float]:
    """CPU of a real ``gpuclaim board`` in a real terminal while nothing happens."""
    root = work / f"idle-{transport}"
    root.mkdir()
    testbed = None
    if transport == "ssh":
        from testbed import Testbed

        testbed = Testbed.up(nodes, gpus=gpus, nvml=True)  # nodes with a driver
        (root / "store").mkdir()  # as an admin makes a store's directory
        config = render_config(
            cluster="bench",
            nodes=testbed.nodes,
            storage=str(root / "store"),
            ssh_config=str(testbed.ssh_config),
        )
        env = {**os.environ, **testbed.env()}
    else:
        from conftest import SimCluster, gpu

        sim = SimCluster(
            root,
            {f"node{i:02d}": [gpu() for _ in range(gpus)] for i in range(1, nodes + 1)},
            fast=True,
        )
        config = sim.config_path.read_text()
        env = dict(os.environ)
    (root / "config.toml").write_text(config)
    runtime = Path(tempfile.mkdtemp(prefix="gcbb-", dir="/tmp"))  # short socket paths
    env.update(
        GPUCLAIM_CONFIG=str(root / "config.toml"),
        GPUCLAIM_HOME=str(root / "home"),
        GPUCLAIM_USER="alice",
        TERM="xterm-256color",
        XDG_RUNTIME_DIR=str(runtime),
    )
    env.pop("TMUX", None)
    sock = f"gcbench-{os.getpid()}-{transport}"
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    command = f"exec {sys.executable} -m gpuclaim board --refresh {refresh}s"
    try:
        started = subprocess.run(
            [
                *tmux,
                "new-session",
                "-d",
                "-x",
                "200",
                "-y",
                "60",
                "-P",
                "-F",
                "#{pane_pid}",
                *[
                    f"-e{k}={env[k]}"
                    for k in (
                        "GPUCLAIM_CONFIG",
                        "GPUCLAIM_HOME",
                        "GPUCLAIM_USER",
                        "XDG_RUNTIME_DIR",
                    )
                ],
                command,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        pid = int(started.stdout.strip())
        _wait_for_screen(tmux, f"{nodes * gpus} GPUs free", 60)
        time.sleep(2 * refresh)  # connections made, agent cached: the steady state
        cpu0, machine0, wall0 = _cpu(pid), machine_cpu(), time.monotonic()
        time.sleep(seconds)
        cpu1, machine1, wall1 = _cpu(pid), machine_cpu(), time.monotonic()
        screen = _screen(tmux)
        if "● live" not in screen:
            raise SystemExit(f"the board stopped refreshing:\n{screen}")
        wall = wall1 - wall0
        return {
            "self %": 100 * (cpu1[0] - cpu0[0]) / wall,
            "children %": 100 * (cpu1[1] - cpu0[1]) / wall,
            # everything on this machine, the nodes' sshd and agents included (on a real
            # cluster that part is spread over the nodes)
            "machine %": 100 * (machine1 - machine0) / wall,
        }
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        if testbed is not None:
            testbed.down()
        for master in (runtime / "gpuclaim-cm").glob("*"):
            if master.is_socket():
                subprocess.run(
                    ["ssh", "-o", f"ControlPath={master}", "-O", "exit", "x"], capture_output=True
                )
        shutil.rmtree(runtime, ignore_errors=True)


def _cpu(pid: int) -> tuple[float, float]:
    """(own CPU seconds, reaped children's CPU seconds) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / tick, (cutime + cstime) / tick


def _screen(tmux: list[str]) -> str:
    return subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout


def _wait_for_screen(tmux: list[str], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in (screen := _screen(tmux)):
        if time.monotonic() > deadline:
            raise SystemExit(f"the board never showed {text!r}:\n{screen}")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds to watch (0: skip)")
    ap.add_argument("--refresh", type=float, default=2.0)
    ap.add_argument("--transport", default="ssh,local")
    args = ap.parse_args()
    if args.idle and not shutil.which("tmux"):
        raise SystemExit("tmux is needed for the idle CPU figure (apt-get install tmux)")
    with tempfile.TemporaryDirectory(prefix="gcbench-board-") as tmp:
        work = Path(tmp)
        r = bench_refresh(args.nodes, args.gpus, args.repeat, work)
        print(
            f"one refresh of {r['gpus']:.0f} GPUs ({args.nodes} nodes, {r['claims']:.0f} "
            f"claims), median of {args.repeat}, ms ({os.cpu_count()} CPUs)"
        )
        for key in ("build", "build+idle", "render full", "render same", "render 10%", "text"):
            print(f"  {key:<12} {r[key]:8.1f}")
        if args.idle:
            print(
                f"\nidle CPU of `gpuclaim board --refresh {args.refresh:g}s` over "
                f"{args.idle:g} s, {args.nodes} nodes × {args.gpus} GPUs, % of one core"
            )
            for transport in args.transport.split(","):
                idle = bench_idle(transport, args.nodes, args.gpus, args.idle, args.refresh, work)
                print(
                    f"  {transport:<6} board {idle['self %']:5.1f}   "
                    f"its children {idle['children %']:5.1f}   "
                    f"whole machine (nodes included) {idle['machine %']:5.1f}"
                )


if __name__ == "__main__":
    main()
