#!/usr/bin/env python3
"""Cluster-view fan-out: ``gpuclaim status --json`` against the plain tools, same run, same nodes.

    python bench/fanout.py [--nodes 1,4,16] [--repeat 5] [--delay-ms 0] [--smi-cost MS]

For each N it starts an sshd testbed of N nodes and times, median of ``--repeat`` runs:
  seq-ssh   for h in nodes: ssh -F cfg $h 'nvidia-smi --query-gpu=...; nvidia-smi
            --query-compute-apps=...' (the by-hand loop: GPUs and who is on them)
  pdsh      pdsh -R ssh -w node[01-N] the same two queries (if pdsh is installed), its
            runs taking turns with the first calls
  py-floor  the least any Python CLI could do: start this Python, spawn the same ssh
            commands pdsh runs, print their output (no config, no parsing, no store);
            taking turns with pdsh and the first calls
  fabric    ssh_client = "fabric" (no ssh binary): new process, new connections, agent cached
  first     the default client (the ssh binary), first call of the day: no master, no warm
            agent, no agent on the node (the bundle is sent)
  warm      the default after a warm-up: masters and warm agents up, a new CLI process each
            time, as a user types it
  board     one more probe of all nodes inside a long-lived process (the board's refresh)
and prints the table plus ratios. Machines are noisy: read the ratios, not lone absolutes.
The nodes have a driver (the simulator's NVML face on their Python path, as a real node has
libnvidia-ml), so gpuclaim reads NVML in-process; ``--smi-only`` takes it away, and
``--smi-cost MS`` too, putting a fake nvidia-smi of that fixed cost in the simulator's place
(``smi_cost.py``): what gpuclaim itself costs, next to a GPU read as fast as a real one.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from cputime import machine_cpu  # noqa: E402
from smi_cost import install  # noqa: E402
from testbed import Testbed  # noqa: E402

from gpuclaim.app.configfile import render_config  # noqa: E402

# What a look at the cluster needs: the GPUs and who runs on them (the baseline).
QUERY = (
    "nvidia-smi --query-gpu=index,uuid,memory.used,memory.total,utilization.gpu"
    " --format=csv,noheader,nounits;"
    " nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory"
    " --format=csv,noheader,nounits"
)


# py-floor: a Python program doing only what pdsh does (argv: ssh config, command, nodes)
_PY_FLOOR = """
import subprocess, sys
cfg, command, nodes = sys.argv[1], sys.argv[2], sys.argv[3:]
out, nothing = subprocess.PIPE, subprocess.DEVNULL
ssh = [["ssh", "-F", cfg, node, command] for node in nodes]
procs = [subprocess.Popen(argv, stdout=out, stdin=nothing) for argv in ssh]
sys.stdout.buffer.write(b"".join(p.communicate()[0] for p in procs))
"""


def timed(fn, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run(argv: list[str], env: dict[str, str], lines: int) -> None:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed: {proc.stderr.strip()[:300]}")
    got = len(proc.stdout.strip().splitlines())
    if lines and got < lines:
        raise SystemExit(f"{argv[:3]}: expected {lines} lines, got {got}")


def _end_agents(tb: Testbed, node: str) -> None:
    """Every gpuclaim agent of this testbed node (serve, serve-detached, an install's
    serve-and), by pid: the node's processes as the testbed knows them, never by a name
    that other people's agents on this machine could match."""
    for pid in tb.node_processes(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"/agent-" in argv and b"serve" in argv:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


def bench_n(
    n: int,
    repeat: int,
    delay_ms: int,
    work: Path,
    nvml: bool = True,
    smi_cost_ms: float | None = None,
    lean: bool = False,
) -> dict[str, float]:
    tb = Testbed.up(n, gpus=4, delay_ms=delay_ms, nvml=nvml and smi_cost_ms is None)
    try:
        if smi_cost_ms is not None:
            install(tb, smi_cost_ms)
        cfg = tb.ssh_config_delayed if delay_ms else tb.ssh_config
        env = {**os.environ, **tb.env(delayed=bool(delay_ms))}
        home = work / f"home{n}"
        home.mkdir(exist_ok=True)
        config = work / f"config{n}.toml"
        (work / f"store{n}").mkdir(exist_ok=True)  # as an admin makes a store's directory
        config.write_text(
            render_config(
                cluster="bench",
                nodes=tb.nodes,
                storage=str(work / f"store{n}"),
                ssh_config=str(cfg),
            )
        )
        genv = {**env, "GPUCLAIM_CONFIG": str(config), "GPUCLAIM_HOME": str(home)}
        results: dict[str, float] = {}

        def seq() -> None:
            for node in tb.nodes:
                run(["ssh", "-F", str(cfg), node, QUERY], env, 4)

        if not lean:
            results["seq-ssh"] = timed(seq, repeat)
        pdsh_once = None
        if shutil.which("pdsh"):
            penv = {**env, "PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS": f"-F {cfg} %h"}
            hosts = ",".join(tb.nodes)

            def pdsh_once() -> None:
                run(["pdsh", "-f", "64", "-w", hosts, QUERY], penv, 4 * n)

            pdsh_once()  # warm-up: the page cache, as for gpuclaim's first call below
        floor = [sys.executable, "-c", _PY_FLOOR, str(cfg), QUERY, *tb.nodes]
        gpuclaim = [sys.executable, "-m", "gpuclaim", "status", "--json"]
        # fabric (paramiko): what a machine without an ssh binary gets, new process each time
        fabric = config.read_text().replace("\nnodes = ", '\nssh_client = "fabric"\nnodes = ', 1)
        fconfig = work / f"config{n}-fabric.toml"
        fconfig.write_text(fabric)
        fenv = {**genv, "GPUCLAIM_CONFIG": str(fconfig)}
        if not lean:
            run(gpuclaim, fenv, 0)  # the first call sends the agent to every node; then cached
            results["fabric"] = timed(lambda: run(gpuclaim, fenv, 4 * n), repeat)
        # the default ("auto": the ssh binary, masters and warm agents)
        cm = Path(tempfile.mkdtemp(prefix="gcb-", dir="/tmp"))  # short socket paths
        oenv = {**genv, "XDG_RUNTIME_DIR": str(cm)}
        ctl = ["-F", str(cfg), "-o", f"ControlPath={cm}/gpuclaim-cm/%C"]

        def first_of_the_day() -> None:
            """Every node's agents gone and its gpuclaim cache removed; no masters."""
            for node in tb.nodes:
                subprocess.run(["ssh", *ctl, "-O", "exit", node], capture_output=True)
                _end_agents(tb, node)
                remove = 'rm -rf "$HOME/.cache/gpuclaim"'
                subprocess.run(["ssh", "-F", str(cfg), node, remove], capture_output=True)
            shutil.rmtree(cm / "gpuclaim-cm", ignore_errors=True)

        # pdsh, the floor and the first call take turns, so that a noisy machine's drift
        # falls on all three; each starts right after the same clean-up (its ssh sessions'
        # and killed agents' ends still running on the nodes' sshd share these cores)
        samples, pdsh_samples, floor_samples = [], [], []
        for _ in range(repeat):
            if pdsh_once is not None:
                first_of_the_day()
                _quiet()
                t0 = time.perf_counter()
                pdsh_once()
                pdsh_samples.append(time.perf_counter() - t0)
            first_of_the_day()
            _quiet()
            t0 = time.perf_counter()
            run(floor, env, 4 * n)
            floor_samples.append(time.perf_counter() - t0)
            first_of_the_day()
            _quiet()
            t0 = time.perf_counter()
            run(gpuclaim, oenv, 4 * n)
            samples.append(time.perf_counter() - t0)
            # the agents it installs behind it (after its exit): not on the next sample's CPU
            _wait_for_installs()
        if pdsh_samples:
            results["pdsh"] = statistics.median(pdsh_samples)
        results["py-floor"] = statistics.median(floor_samples)
        results["first"] = statistics.median(samples)
        _until_warm(gpuclaim, oenv, cm / "gpuclaim-cm" / "w", n)
        machine0, cli0 = machine_cpu(), _children_cpu()
        results["warm"] = timed(lambda: run(gpuclaim, oenv, 4 * n), repeat)
        machine, cli = machine_cpu() - machine0, _children_cpu() - cli0
        # CPU per warm look: the CLI process, and everything else per node (the nodes' sshd
        # and warm agents, plus the laptop's ssh masters relaying): on a real cluster the
        # node part runs on each node, in parallel
        results["cli cpu"] = cli / repeat
        results["node cpu"] = max(0.0, machine - cli) / repeat / n
        # the same with every look reading the GPUs (gpu_read_max_age = 0): no answer from
        # the warm agent's last read, however recent
        rconfig = work / f"config{n}-read.toml"
        every_look_reads = "[defaults]\ngpu_read_max_age = 0"
        rconfig.write_text(config.read_text().replace("[defaults]", every_look_reads, 1))
        renv = {**oenv, "GPUCLAIM_CONFIG": str(rconfig)}
        results["warm-read"] = timed(lambda: run(gpuclaim, renv, 4 * n), repeat)
        if not lean:
            results["board"] = _warm(config, oenv, repeat)
        first_of_the_day()
        shutil.rmtree(cm, ignore_errors=True)
        return results
    finally:
        tb.down()


def _quiet(window: float = 0.1, busy: float = 0.1, timeout: float = 3.0) -> None:
    """Until the machine's CPU was under ``busy`` of one core for ``window`` seconds: what
    the clean-up left running (sshd sessions ending, agents exiting) is not on the next
    sample's cores, for any of the tools."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        used = machine_cpu()
        time.sleep(window)
        if machine_cpu() - used < busy * window:
            return


def _wait_for_installs(timeout: float = 60.0) -> None:
    """Until no agent install a first call left behind runs (remote.warm: after its exit)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = False
        for entry in Path("/proc").iterdir():
            try:
                if b"gpuclaim-agent-missing" in (entry / "cmdline").read_bytes():
                    running = True
                    break
            except OSError:
                continue
        if not running:
            return
        time.sleep(0.05)
    raise SystemExit("the agents' background installs did not finish")


def _until_warm(gpuclaim: list[str], env: dict[str, str], forwarded: Path, n: int) -> None:
    """Looks until every node answers through its warm agent (a first look is sh's; the
    agent comes up behind it and a later look forwards to it)."""
    deadline = time.monotonic() + 60
    while len(list(forwarded.glob("w-*.sock"))) < n:
        if time.monotonic() > deadline:
            raise SystemExit("the warm agents never came up")
        run(gpuclaim, env, 0)
        time.sleep(0.1)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _warm(config: Path, env: dict[str, str], repeat: int) -> float:
    code = (
        "import os,sys,time,statistics\n"
        "from gpuclaim.app.configfile import load_config\n"
        "from gpuclaim.app.wiring import make_prober\n"
        "cfg=load_config()\n"
        "p=make_prober(cfg); p.probe(cfg.nodes)\n"
        "s=[]\n"
        f"for _ in range({repeat}):\n"
        "    t=time.perf_counter(); inv=p.probe(cfg.nodes); s.append(time.perf_counter()-t)\n"
        "    assert all(i.reachable and not i.error for i in inv.values()), inv\n"
        "print(statistics.median(s))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"warm probe failed: {proc.stderr[-500:]}")
    return float(proc.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,4,16")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--delay-ms", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="Print one JSON line at the end.")
    ap.add_argument(
        "--smi-cost",
        type=float,
        default=None,
        metavar="MS",
        help="A fake nvidia-smi of this fixed cost in place of the simulator (no NVML).",
    )
    ap.add_argument(
        "--lean", action="store_true", help="Only pdsh, first and warm (no seq-ssh, fabric, board)."
    )
    ap.add_argument(
        "--smi-only",
        action="store_true",
        help="Nodes without NVML bindings' library: gpuclaim must run nvidia-smi too.",
    )
    args = ap.parse_args()
    # As installed (pip byte-compiles): with PYTHONDONTWRITEBYTECODE set, every CLI start
    # would otherwise compile each module changed since its last .pyc
    compileall.compile_dir(str(REPO / "gpuclaim"), quiet=1)
    sizes = [int(x) for x in args.nodes.split(",")]
    with tempfile.TemporaryDirectory(prefix="gcbench-") as tmp:
        table = {
            n: bench_n(
                n,
                args.repeat,
                args.delay_ms,
                Path(tmp),
                not args.smi_only,
                args.smi_cost,
                args.lean,
            )
            for n in sizes
        }
    if args.json:
        import json

        print(json.dumps({"delay_ms": args.delay_ms, "smi_cost_ms": args.smi_cost, "table": table}))
        return
    methods = list(next(iter(table.values())))
    print(
        f"\nfan-out, median of {args.repeat}, seconds "
        f"(RTT {args.delay_ms} ms, {os.cpu_count()} CPUs, "
        f"nodes {'with nvidia-smi only' if args.smi_only else 'with NVML'})"
    )
    print("method    " + "".join(f"{'N=' + str(n):>10}" for n in sizes))
    for m in methods:
        print(f"{m:<10}" + "".join(f"{table[n][m]:>10.3f}" for n in sizes))
    first, last = sizes[0], sizes[-1]
    print("(cli cpu: CPU seconds of one warm status; node cpu: the rest, per node)")
    print("\nratios against pdsh (targets: warm <= 0.30, first <= 1.0)")
    for n in sizes:
        row = table[n]
        if "pdsh" in row:
            parts = [
                f"{m} {row[m] / row['pdsh']:.2f}"
                for m in ("warm", "first", "py-floor", "fabric")
                if m in row
            ]
            print(f"N={n:<4} " + "  ".join(parts))
    print(f"warm N={last} / warm N={first}: {table[last]['warm'] / table[first]['warm']:.2f}")


if __name__ == "__main__":
    main()
