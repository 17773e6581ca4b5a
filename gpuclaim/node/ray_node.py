"""One rank of a ``run --ray`` job: a Ray node of the job's own Ray cluster, and on rank 0 the
command, run against it (``RAY_ADDRESS``).

The wrapper runs this in place of the command, in the job's environment (its venv or conda
env first on PATH: Ray is the job's dependency, never gpuclaim's) with CUDA_VISIBLE_DEVICES
pinned to the claim, so Ray sees exactly the claimed GPUs (``--num-gpus`` says how many).
Rank 0 starts the head (``ray start --head --block``), publishes its address in the job's
record, waits until every rank's node joined, runs the command, then stops its Ray node;
the other ranks wait for that address, join, and stay until the job stops them. Every Ray
node has ports and a temp dir of its own (``ray_ports``) and is stopped by its own
processes (its ``ray start`` and what carries its mark), never by ``ray stop``, which would
stop every Ray node of the account on that machine. Standard library only, Python 3.9.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from gpuclaim.node import ray_ports as rp

JOIN_TIMEOUT_S = 180.0  # every node joined by then, or the job fails saying which did not
STOP_GRACE_S = 5.0  # a Ray node's `ray start` gets this long after SIGTERM, then SIGKILL
DASHBOARD_WAIT_S = 60.0  # a dashboard not answering by then is taken to be none
_NODE_IP = re.compile(r"Local node IP: (\S+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # colours, where Ray's optional `colorful` is there

# Run with the job's Python (the one of its `ray`): waits until N nodes are alive.
_WAIT_FOR_NODES = """
import sys, time
import ray
address, want, until = sys.argv[1], int(sys.argv[2]), time.time() + float(sys.argv[3])
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
while True:
    alive = [n for n in ray.nodes() if n.get("Alive")]
    if len(alive) >= want:
        sys.exit(0)
    if time.time() > until:
        print(f"gpuclaim: only {len(alive)} of {want} Ray nodes joined", flush=True)
        sys.exit(1)
    time.sleep(0.2)
"""


class RayNode:
    """This rank's Ray node: its ports, temp dir, mark, and its ``ray start`` process."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.rank = int(spec["rank"])
        self.mark = f"{spec['job_id']}-{self.rank}"
        self.block: Optional[rp.PortBlock] = None
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.node_ip: Optional[str] = None
        self.stopping = False
        self.temp = rp.temp_dir(str(spec["job_id"]), self.rank)

    def environment(self, **more: str) -> dict[str, str]:
        env = dict(os.environ, **more)
        env[rp.MARK] = self.mark
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a lab's node may be offline
        return env

    def start(self, ray: str, head_address: Optional[str]) -> None:
        self.block = rp.take_block()
        self.temp.mkdir(mode=0o700, parents=True, exist_ok=True)
        argv = start_argv(
            ray,
            self.block,
            str(self.temp),
            num_gpus=int(self.spec["num_gpus"]),
            num_cpus=self.spec.get("num_cpus"),
            head_address=head_address,
            client=has_module(ray, "grpc"),
        )
        self.proc = subprocess.Popen(
            argv, env=self.environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        threading.Thread(target=self._echo, daemon=True).start()

    def _echo(self) -> None:
        """``ray start``'s output into the job's log; the node IP it chose, as it says it."""
        assert self.proc is not None and self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            m = _NODE_IP.search(_ANSI.sub("", raw.decode("utf-8", "replace")))
            if m and self.node_ip is None:
                self.node_ip = m.group(1)
            sys.stdout.buffer.write(raw)
            sys.stdout.flush()

    def wait_up(self, timeout: float) -> str:
        """The head's GCS address once it answers; RuntimeError if ``ray start`` ended."""
        assert self.proc is not None and self.block is not None
        port = self.block.port(rp.GCS)
        until = time.monotonic() + timeout
        while time.monotonic() < until:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start ended with status {self.proc.returncode}")
            if self.node_ip is not None and answers(self.node_ip, port):
                return f"{self.node_ip}:{port}"
            time.sleep(0.1)
        raise RuntimeError(f"the Ray head did not answer on port {port} within {timeout:g}s")

    def stop(self) -> None:
        """This node's Ray processes, and only those: its ``ray start`` (which stops what it
        started), then whatever still carries its mark."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rp.kill_marked(self.mark)
        if self.block is not None:
            self.block.release()


def start_argv(
    ray: str,
    block: rp.PortBlock,
    temp: str,
    num_gpus: int,
    num_cpus: Optional[int],
    head_address: Optional[str],
    client: bool,
) -> list[str]:
    """``ray start --block`` with every port a Ray node opens taken from ``block``."""
    p = block.port
    argv = [
        ray,
        "start",
        "--block",
        "--disable-usage-stats",
        "--log-color=false",  # a log file, not a terminal
        f"--temp-dir={temp}",
        f"--num-gpus={num_gpus}",
        f"--node-manager-port={p(rp.NODE_MANAGER)}",
        f"--object-manager-port={p(rp.OBJECT_MANAGER)}",
        f"--min-worker-port={p(rp.FIRST_WORKER)}",
        f"--max-worker-port={p(rp.BLOCK - 1)}",
        f"--dashboard-agent-listen-port={p(rp.AGENT_LISTEN)}",
        f"--dashboard-agent-grpc-port={p(rp.AGENT_GRPC)}",
        f"--runtime-env-agent-port={p(rp.RUNTIME_ENV)}",
        f"--metrics-export-port={p(rp.METRICS)}",
    ]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    if head_address is None:
        argv += [
            "--head",
            f"--port={p(rp.GCS)}",
            f"--dashboard-port={p(rp.DASHBOARD)}",
            "--dashboard-host=127.0.0.1",  # reached through `gpuclaim forward JOB --dashboard`
        ]
        if client:  # else Ray refuses the flag; with it, Ray would take 10001 by itself
            argv.append(f"--ray-client-server-port={p(rp.CLIENT)}")
    else:
        argv.append(f"--address={head_address}")
    return argv


def interpreter(script: str) -> str:
    """The Python a console script (``ray``) runs with: its ``#!`` line."""
    try:
        with open(script, "rb") as f:
            first = f.readline().decode("utf-8", "replace").strip()
    except OSError:
        return "python3"
    words = first[2:].split() if first.startswith("#!") else []
    return words[0] if words else "python3"


def has_module(ray: str, name: str) -> bool:
    """Whether the Python of ``ray`` can import ``name`` (Ray's optional parts)."""
    code = f"import importlib.util as u, sys; sys.exit(u.find_spec({name!r}) is None)"
    try:
        done = subprocess.run([interpreter(ray), "-c", code], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def run_head(spec: dict[str, Any], ray: str) -> int:
    node = RayNode(spec)
    stopped: list[int] = []
    child: list[subprocess.Popen[bytes]] = []

    def on_term(signum: int, frame: Any) -> None:
        stopped.append(signum)
        for c in child:
            if c.poll() is None:
                c.send_signal(signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    try:
        node.start(ray, None)
        address = node.wait_up(JOIN_TIMEOUT_S)
        _publish(spec, address, node)
        nodes = int(spec["nnodes"])
        say(f"Ray head at {address}; waiting for {nodes} node(s) to join")
        wait = [interpreter(ray), "-c", _WAIT_FOR_NODES, address, str(nodes), str(JOIN_TIMEOUT_S)]
        joined = subprocess.run(wait, env=node.environment(), check=False)
        if stopped:
            return 128 + stopped[0]
        if joined.returncode != 0:
            say("the Ray cluster did not come up: see above")
            return 1
        threading.Thread(target=_dashboard_up, args=(spec, address, node), daemon=True).start()
        say(f"Ray cluster up: {nodes} node(s); running the command with RAY_ADDRESS={address}")
        command = subprocess.Popen(list(spec["argv"]), env=node.environment(RAY_ADDRESS=address))
        child.append(command)
        code = command.wait()
        return code if code >= 0 else 128 - code
    except (OSError, RuntimeError) as exc:
        say(str(exc))
        return 127 if isinstance(exc, FileNotFoundError) else 1
    finally:
        node.stop()
        say("Ray head stopped")


def run_worker(spec: dict[str, Any], ray: str) -> int:
    node = RayNode(spec)
    stopped: list[int] = []

    def on_term(signum: int, frame: Any) -> None:
        stopped.append(signum)  # the job is over (or killed): this node leaves at once

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    try:
        address = _head_address(spec, stopped)
        if address is None:
            return 0 if stopped else 1
        say(f"joining the Ray head at {address}")
        node.start(ray, address)
        assert node.proc is not None
        while node.proc.poll() is None and not stopped:
            time.sleep(0.2)
        if stopped:
            return 0  # stopped with the job: its end is rank 0's
        say(f"ray start ended with status {node.proc.returncode}")
        return node.proc.returncode or 1
    except (OSError, RuntimeError) as exc:
        say(str(exc))
        return 1
    finally:
        node.stop()
        say("Ray node stopped")


def _publish(spec: dict[str, Any], address: str, node: RayNode, dashboard: bool = False) -> None:
    """The head's address into the job's record: the other ranks join there, and
    ``forward --dashboard`` finds the dashboard (once it answers)."""
    from gpuclaim.store import ClaimStore

    assert node.block is not None
    head = {
        "address": address,
        "node": spec["node"],
        "dashboard_port": node.block.port(rp.DASHBOARD),
        "dashboard": dashboard,
    }
    ClaimStore(Path(spec["store_root"])).update_job(
        job_id=str(spec["job_id"]), changes={"ray_head": head}
    )


def _dashboard_up(spec: dict[str, Any], address: str, node: RayNode) -> None:
    """Say in the record once the dashboard answers (the minimal ``pip install ray`` has
    none: ``ray[default]`` does)."""
    from gpuclaim.core.errors import GpuclaimError

    assert node.block is not None
    until = time.monotonic() + DASHBOARD_WAIT_S
    while time.monotonic() < until and node.proc is not None and node.proc.poll() is None:
        if answers("127.0.0.1", node.block.port(rp.DASHBOARD)):
            try:
                _publish(spec, address, node, dashboard=True)
            except GpuclaimError:
                pass  # the store hiccuped: forward --dashboard says there is none
            return
        time.sleep(0.5)


def _head_address(spec: dict[str, Any], stopped: list[int]) -> Optional[str]:
    from gpuclaim.core.errors import GpuclaimError
    from gpuclaim.store import ClaimStore

    store = ClaimStore(Path(spec["store_root"]))
    until = time.monotonic() + JOIN_TIMEOUT_S
    while not stopped and time.monotonic() < until:
        try:
            job = store.load_job(str(spec["job_id"]))
        except GpuclaimError:
            job = None
        if job is not None and job.ray_head and job.ray_head.get("address"):
            return str(job.ray_head["address"])
        time.sleep(0.2)
    if not stopped:
        say(f"no Ray head answered within {JOIN_TIMEOUT_S:g}s")
    return None


def say(text: str) -> None:
    sys.stdout.write(f"gpuclaim: {text}\n")
    sys.stdout.flush()


_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from gpuclaim.node.ray_node import main; sys.exit(main(sys.argv[2]))"
)


def supervisor_argv(spec: dict[str, Any]) -> list[str]:
    """What the wrapper runs in place of a ``run --ray`` job's command: this module, with
    gpuclaim's own Python and files (not the job's), told ``spec``."""
    import gpuclaim

    root = str(Path(gpuclaim.__file__).resolve().parent.parent)
    return [sys.executable, "-c", _BOOT, root, json.dumps(spec)]


def main(raw: str) -> int:
    spec = json.loads(raw)
    ray = shutil.which("ray")
    if ray is None:
        say("ray is not installed in this job's environment (pip install ray in its venv)")
        return 127
    return run_head(spec, ray) if int(spec["rank"]) == 0 else run_worker(spec, ray)
