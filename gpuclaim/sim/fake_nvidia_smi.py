#!/usr/bin/env python3
"""A fake ``nvidia-smi`` for simulated GPUs (standard library only, Python 3.9+).

Put it on PATH as ``nvidia-smi`` on a test node, or run
``python3 -m gpuclaim.sim.fake_nvidia_smi``.  It imports nothing from gpuclaim, so
the file can be copied anywhere, with ``fake_report.py`` beside it.

State: the JSON file named by ``$GPUCLAIM_SIM_STATE``; this node is ``$GPUCLAIM_NODE``
(default: the short host name)::

    {"driver_version": "550.54.15",
     "nodes": {"node01": {"fail": false, "delay_ms": 0,
                          "gpus": [{"name": "NVIDIA H100 80GB HBM3",
                                    "memory_total_mib": 81559, "memory_used_mib": 0,
                                    "utilization_pct": 0, "mig": false,
                                    "processes": [{"pid": 4242, "name": "python",
                                                   "used_memory_mib": 20000,
                                                   "type": "C"}]}]}}}

Every key but ``nodes`` is optional; ``"gpus": 4`` is short for four default H100s.
``"mig": ["3g.40gb", "1g.10gb"]`` puts a GPU in MIG mode with those slices (``true``: MIG
mode, no slices yet); a slice's UUID is :func:`sim_mig_uuid`, its GPU instance id
``2 * N + 1`` (not its number, as on real GPUs), its memory the profile's GB in GiB less
256 MiB (``"mig_memory_mib": [..]`` sets it). A job whose ``CUDA_VISIBLE_DEVICES`` names
a slice's UUID runs in that slice: ``-q -x`` lists it under the GPU with its instance ids.
``memory_total_mib: null`` prints ``[N/A]`` like a unified-memory GB10;
``"persistence": false`` reports persistence mode off.  A GPU's ``memory.used`` is
``memory_used_mib`` (a baseline) plus the memory of its listed processes and of live jobs.
A GPU's UUID is :func:`sim_uuid` of node and index and its bus id is
``00000000:<index+1>:00.0``.  Writers should replace the file atomically
(write a temp file, then rename).

A node with ``"fail": true``, a missing state file or a node not in it behaves like a
machine without a driver: the real message on stdout and exit status 9.  ``delay_ms``
sleeps before anything is printed (a slow or hung driver).

Live jobs: every leaf process (no children; not this process or its ancestors) whose
environment has ``GPUCLAIM_NODE`` equal to this node and a non-empty
``CUDA_VISIBLE_DEVICES`` (indices or GPU UUIDs) is a compute app on those GPUs, named
by its ``argv[0]``, using ``$GPUCLAIM_FAKE_MEM_MIB`` MiB (default 1024) of each, and
setting their utilization to ``$GPUCLAIM_FAKE_UTIL_PCT`` (default 100).  Processes
that cannot be read are skipped.

Supported: no arguments (a summary table), ``-L``, ``--query-gpu=``,
``--query-compute-apps=``, ``--format=csv[,noheader][,nounits]``, ``-q -x`` (the XML
report, the parts gpuclaim reads), ``-i``/``--id=``, ``--version``.  Headers, units and
error messages follow the real tool.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

try:  # inside the package, or copied alone beside it (a test node's bin/)
    from gpuclaim.sim.fake_report import SimSlice, listed, profile_mib, query_xml
except ImportError:  # pragma: no cover - the copied layout
    from fake_report import SimSlice, listed, profile_mib, query_xml  # type: ignore[import-not-found,no-redef]

NO_DRIVER_MESSAGE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
EXIT_NO_DRIVER = 9
EXIT_NOT_FOUND = 6
EXIT_USAGE = 2
DEFAULT_DRIVER = "550.54.15"
DEFAULT_GPU = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}
FAKE_MEM_ENV = "GPUCLAIM_FAKE_MEM_MIB"
FAKE_UTIL_ENV = "GPUCLAIM_FAKE_UTIL_PCT"
USAGE = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."


def sim_uuid(node: str, index: int) -> str:
    """The simulated GPU's UUID: md5 of ``f"{node}-{index}"`` shaped like a real one."""
    h = hashlib.md5(f"{node}-{index}".encode(), usedforsecurity=False).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def sim_bus_id(index: int) -> str:
    return f"00000000:{index + 1:02X}:00.0"


class SimProcess:
    def __init__(self, pid: int, name: str, used_mib: Optional[int], kind: str = "C") -> None:
        self.pid = pid
        self.name = name
        self.used_mib = used_mib
        self.kind = kind
        self.gpu_instance: Optional[int] = None  # in a MIG slice: its GPU instance id


class SimGpu:
    """One simulated GPU, with live jobs already folded in."""

    def __init__(self, node: str, index: int, spec: dict[str, Any]) -> None:
        self.index = index
        self.uuid = sim_uuid(node, index)
        self.bus_id = sim_bus_id(index)
        self.name = str(spec.get("name", DEFAULT_GPU["name"]))
        total = spec.get("memory_total_mib", DEFAULT_GPU["memory_total_mib"])
        self.total: Optional[int] = None if total is None else int(total)
        self.base_used = int(spec.get("memory_used_mib") or 0)
        self.util = int(spec.get("utilization_pct") or 0)
        mig = spec.get("mig", False)
        self.mig = bool(mig)
        profiles = [str(m) for m in mig] if isinstance(mig, list) else []
        sizes = list(spec.get("mig_memory_mib") or [profile_mib(m) for m in profiles])
        self.slices = [
            SimSlice(node, index, n, m, int(size), f"{self.name} MIG {m}")
            for n, (m, size) in enumerate(zip(profiles, sizes))
        ]
        self.persistence = bool(spec.get("persistence", True))
        self.processes = [
            SimProcess(
                int(p["pid"]),
                str(p.get("name", "python")),
                None if p.get("used_memory_mib") is None else int(p["used_memory_mib"]),
                str(p.get("type", "C")),
            )
            for p in spec.get("processes") or ()
        ]
        self.temperature = spec.get("temperature_c")
        self.power = spec.get("power_draw_w")
        self.has_jobs = False

    def add_job(self, proc: SimProcess, util: int, in_slice: Optional[SimSlice] = None) -> None:
        """A live job: its memory counts as used and its utilization replaces the baseline."""
        if in_slice is not None:
            in_slice.processes.append(proc)
            proc.gpu_instance = in_slice.gpu_instance
        self.processes.append(proc)
        self.util = max(self.util, util) if self.has_jobs else util
        self.has_jobs = True

    @property
    def used(self) -> Optional[int]:
        if self.total is None:
            return None
        used = self.base_used + sum(p.used_mib or 0 for p in self.processes)
        return min(used, self.total)

    @property
    def free(self) -> Optional[int]:
        used = self.used
        return None if self.total is None or used is None else self.total - used

    @property
    def utilization(self) -> Optional[int]:
        return None if self.mig else max(0, min(100, self.util))


class Context:
    def __init__(self, driver: str, gpus: list[SimGpu]) -> None:
        self.driver = driver
        self.gpus = gpus
        now = dt.datetime.now()
        self.timestamp = now.strftime("%Y/%m/%d %H:%M:%S.") + f"{now.microsecond // 1000:03d}"


# field -> (unit, getter); a getter returning None prints [N/A].
Getter = Callable[[Context, SimGpu], Any]
GPU_FIELDS: dict[str, tuple[Optional[str], Getter]] = {
    "timestamp": (None, lambda c, g: c.timestamp),
    "driver_version": (None, lambda c, g: c.driver),
    "count": (None, lambda c, g: len(c.gpus)),
    "name": (None, lambda c, g: g.name),
    "serial": (None, lambda c, g: None),
    "uuid": (None, lambda c, g: g.uuid),
    "pci.bus_id": (None, lambda c, g: g.bus_id),
    "index": (None, lambda c, g: g.index),
    "persistence_mode": (None, lambda c, g: "Enabled" if g.persistence else "Disabled"),
    "pstate": (None, lambda c, g: "P0" if g.util else "P8"),
    "memory.total": ("MiB", lambda c, g: g.total),
    "memory.reserved": ("MiB", lambda c, g: None if g.total is None else 0),
    "memory.used": ("MiB", lambda c, g: g.used),
    "memory.free": ("MiB", lambda c, g: g.free),
    "compute_mode": (None, lambda c, g: "Default"),
    "utilization.gpu": ("%", lambda c, g: g.utilization),
    "utilization.memory": (
        "%",
        lambda c, g: None if g.utilization is None else g.utilization // 2,
    ),
    "temperature.gpu": (
        None,
        lambda c, g: g.temperature if g.temperature is not None else 30 + g.util // 3,
    ),
    "power.draw": (
        "W",
        lambda c, g: f"{float(g.power if g.power is not None else 60 + 5 * g.util):.2f}",
    ),
    "mig.mode.current": (None, lambda c, g: "Enabled" if g.mig else "Disabled"),
    "mig.mode.pending": (None, lambda c, g: "Enabled" if g.mig else "Disabled"),
}
GPU_ALIASES = {"gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid"}
GPU_ALIASES.update({"gpu_bus_id": "pci.bus_id", "power.draw.instant": "power.draw"})

AppGetter = Callable[[Context, SimGpu, SimProcess], Any]
APP_FIELDS: dict[str, tuple[Optional[str], AppGetter]] = {
    "timestamp": (None, lambda c, g, p: c.timestamp),
    "gpu_name": (None, lambda c, g, p: g.name),
    "gpu_bus_id": (None, lambda c, g, p: g.bus_id),
    "gpu_serial": (None, lambda c, g, p: None),
    "gpu_uuid": (None, lambda c, g, p: g.uuid),
    "pid": (None, lambda c, g, p: p.pid),
    "process_name": (None, lambda c, g, p: p.name),
    "used_gpu_memory": ("MiB", lambda c, g, p: p.used_mib),
}
APP_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}


class Exit(Exception):
    """Stop with this exit status after printing ``message`` (stdout, like the real tool)."""

    def __init__(self, code: int, message: str = "", stderr: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.stderr = stderr


# --- arguments ---------------------------------------------------------------------------


def parse_args(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {"mode": "table", "fields": None, "format": None, "ids": None}
    opts["xml"] = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, has_value, value = arg.partition("=")
        if name in ("--query-gpu", "--query-compute-apps", "--format", "-i", "--id"):
            if not has_value:
                i += 1
                if i >= len(argv):
                    raise Exit(EXIT_USAGE, USAGE)
                value = argv[i]
            if name in ("--query-gpu", "--query-compute-apps"):
                if opts["mode"] != "table":
                    raise Exit(EXIT_USAGE, USAGE)
                opts["mode"] = "gpu" if name == "--query-gpu" else "apps"
                opts["fields"] = [f.strip() for f in value.split(",") if f.strip()]
            elif name == "--format":
                opts["format"] = [f.strip() for f in value.split(",")]
            else:
                opts["ids"] = [t.strip() for t in value.split(",") if t.strip()]
        elif arg in ("-L", "--list-gpus", "--version") and opts["mode"] == "table":
            opts["mode"] = {"-L": "list", "--list-gpus": "list"}.get(arg, "version")
        elif arg in ("-q", "--query") and opts["mode"] == "table":
            opts["mode"] = "query"
        elif arg in ("-x", "--xml-format"):
            opts["xml"] = True
        else:
            raise Exit(EXIT_USAGE, USAGE)
        i += 1
    if opts["xml"] != (opts["mode"] == "query"):  # only -q -x: the text form is not simulated
        raise Exit(EXIT_USAGE, USAGE)
    if opts["mode"] in ("gpu", "apps"):
        fmt = opts["format"]
        if not fmt or "csv" not in fmt or not set(fmt) <= {"csv", "noheader", "nounits"}:
            raise Exit(EXIT_USAGE, '"--format" option is required and must include "csv".')
        table, aliases = (
            (GPU_FIELDS, GPU_ALIASES) if opts["mode"] == "gpu" else (APP_FIELDS, APP_ALIASES)
        )
        for field in opts["fields"]:
            if aliases.get(field, field) not in table:
                raise Exit(EXIT_USAGE, f'Field "{field}" is not a valid field to query.')
        if not opts["fields"]:
            raise Exit(EXIT_USAGE, USAGE)
    return opts


# --- state and live jobs -----------------------------------------------------------------


def load_node(node: str) -> tuple[str, dict[str, Any]]:
    """(driver version, the node's entry), or Exit(9) when there is no such simulated node."""
    path = os.environ.get("GPUCLAIM_SIM_STATE")
    if not path:
        raise Exit(EXIT_NO_DRIVER, NO_DRIVER_MESSAGE)
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        raise Exit(EXIT_NO_DRIVER, NO_DRIVER_MESSAGE) from None
    except (OSError, ValueError) as exc:
        message = f"fake nvidia-smi: cannot read state file {path}: {exc}"
        raise Exit(1, message, stderr=True) from None
    entry = (state.get("nodes") or {}).get(node)
    if not isinstance(entry, dict):
        raise Exit(EXIT_NO_DRIVER, NO_DRIVER_MESSAGE)
    return str(state.get("driver_version") or DEFAULT_DRIVER), entry


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def process_table() -> dict[int, int]:
    """pid -> parent pid for every process that can be seen in /proc."""
    table = {}
    for path in Path("/proc").iterdir():
        if not path.name.isdigit():
            continue
        try:
            stat = _read(f"{path}/stat").decode("ascii", "replace")
            table[int(path.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return table


# A "driver" that sees every account's processes, as the real one does: another account's
# /proc/PID/environ is closed to us, so on a testbed with several accounts a root process
# answers on this socket (:mod:`gpuclaim.sim.sim_driver`) what this module would find.
DRIVER_ENV = "GPUCLAIM_SIM_DRIVER"


def node_jobs(node: str) -> list[tuple[int, str, dict[str, str]]]:
    """The node's live jobs: from the driver where there is one, else as this user sees them."""
    path = os.environ.get(DRIVER_ENV)
    if path and Path(path).exists():
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(10)
                conn.connect(path)
                ask = {"node": node, "state": os.environ.get("GPUCLAIM_SIM_STATE")}
                conn.sendall(json.dumps(ask).encode() + b"\n")
                data = b""
                while not data.endswith(b"\n"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            return [(int(p), str(a), dict(e)) for p, a, e in json.loads(data)]
        except (OSError, ValueError, TypeError):
            pass
    return live_jobs(node)


def live_jobs(
    node: str, asker: Optional[int] = None, state: Optional[str] = None
) -> list[tuple[int, str, dict[str, str]]]:
    """(pid, argv[0], environment) of each leaf process that simulates a job on ``node``
    (the asking process and its ancestors are no job: they are the look itself)."""
    table = process_table()
    parents = set(table.values())
    pid = os.getpid() if asker is None else asker
    skip = {pid}
    while pid in table and table[pid] not in skip and table[pid] > 0:
        pid = table[pid]
        skip.add(pid)
    if asker is None:
        skip.add(os.getppid())
    if state is None:
        state = os.environ.get("GPUCLAIM_SIM_STATE")
    jobs = []
    for pid in sorted(table):
        if pid in skip or pid in parents:
            continue
        try:
            environ = _read(f"/proc/{pid}/environ")
            cmdline = _read(f"/proc/{pid}/cmdline")
        except OSError:
            continue
        env = {}
        for item in environ.split(b"\0"):
            key, eq, value = item.partition(b"=")
            if eq:
                env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        if env.get("GPUCLAIM_NODE") != node or not env.get("CUDA_VISIBLE_DEVICES", "").strip():
            continue
        # Same node name in another simulated cluster (another test, another sandbox), or a
        # process of no cluster (a test's own): not a job here. CI saw a GPU of a fresh
        # cluster busy with some other test's process that carried no state at all.
        if state and env.get("GPUCLAIM_SIM_STATE") != state:
            continue
        argv0 = cmdline.split(b"\0")[0].decode("utf-8", "replace")
        if argv0:
            jobs.append((pid, argv0, env))
    return jobs


def visible_gpus(value: str, gpus: list[SimGpu]) -> list[SimGpu]:
    """The GPUs a CUDA_VISIBLE_DEVICES value names (indices, UUIDs or unique UUID prefixes)."""
    return [g for g, _ in visible_devices(value, gpus)]


def visible_devices(value: str, gpus: list[SimGpu]) -> list[tuple[SimGpu, Optional[SimSlice]]]:
    """The GPUs and MIG slices (by ``MIG-`` UUID) a CUDA_VISIBLE_DEVICES value names."""
    out: list[tuple[SimGpu, Optional[SimSlice]]] = []
    for token in (t.strip() for t in value.split(",")):
        if not token:
            continue
        if token.startswith("MIG-"):
            out += [(g, m) for g in gpus for m in g.slices if m.uuid == token]
            continue
        if token.isdigit():
            found = [g for g in gpus if g.index == int(token)]
        else:
            found = [g for g in gpus if g.uuid == token]
            if not found and token.startswith("GPU-"):
                found = [g for g in gpus if g.uuid.startswith(token)]
        if len(found) == 1 and (found[0], None) not in out:
            out.append((found[0], None))
    return out


def _env_int(env: dict[str, str], key: str, default: int) -> int:
    try:
        return int(env.get(key, default))
    except ValueError:
        return default


def build_gpus(node: str, entry: dict[str, Any]) -> list[SimGpu]:
    specs = entry.get("gpus", [])
    if isinstance(specs, int):
        specs = [{} for _ in range(specs)]
    gpus = [SimGpu(node, i, spec or {}) for i, spec in enumerate(specs)]
    for pid, argv0, env in node_jobs(node):
        mem = _env_int(env, FAKE_MEM_ENV, 1024)
        util = _env_int(env, FAKE_UTIL_ENV, 100)
        for gpu, in_slice in visible_devices(env["CUDA_VISIBLE_DEVICES"], gpus):
            gpu.add_job(SimProcess(pid, argv0, mem), util, in_slice)
    return gpus


def select(gpus: list[SimGpu], ids: Optional[list[str]]) -> list[SimGpu]:
    if ids is None:
        return gpus
    chosen: list[SimGpu] = []
    for token in ids:
        found = [
            g
            for g in gpus
            if token in (str(g.index), g.uuid, g.bus_id) or g.bus_id.endswith(token.upper())
        ]
        if not found:
            raise Exit(EXIT_NOT_FOUND, "No devices were found")
        chosen.extend(g for g in found if g not in chosen)
    return chosen


# --- output ------------------------------------------------------------------------------


def _cell(value: Any, unit: Optional[str], units: bool) -> str:
    if value is None:
        return "[N/A]"
    return f"{value} {unit}" if unit and units else str(value)


def csv_lines(
    fields: list[str],
    table: dict[str, tuple[Optional[str], Any]],
    aliases: dict[str, str],
    rows: list[tuple[Any, ...]],
    fmt: list[str],
) -> list[str]:
    canonical = [aliases.get(f, f) for f in fields]
    units = "nounits" not in fmt
    lines = []
    if "noheader" not in fmt:
        header = []
        for name in canonical:
            unit = table[name][0]
            header.append(f"{name} [{unit}]" if unit and units else name)
        lines.append(", ".join(header))
    for args in rows:
        cells = []
        for name in canonical:
            unit, getter = table[name]
            cells.append(_cell(getter(*args), unit, units))
        lines.append(", ".join(cells))
    return lines


def summary(ctx: Context, gpus: list[SimGpu], node: str) -> list[str]:
    def mib(value: Optional[int]) -> str:
        return "N/A" if value is None else f"{value}MiB"

    lines = [
        ctx.timestamp,
        f"NVIDIA-SMI (gpuclaim simulator)  Driver Version: {ctx.driver}  Node: {node}",
        "",
        f"{'GPU':>3}  {'Name':<28} {'Bus-Id':<17} {'Memory-Usage':>22} {'GPU-Util':>8}",
    ]
    for g in gpus:
        memory = f"{mib(g.used)} / {mib(g.total)}"
        util = "N/A" if g.utilization is None else f"{g.utilization}%"
        lines.append(f"{g.index:>3}  {g.name[:28]:<28} {g.bus_id:<17} {memory:>22} {util:>8}")
    lines += [
        "",
        "Processes:",
        f"{'GPU':>3}  {'PID':>8}  {'Type':<4}  {'Process name':<32} GPU Memory",
    ]
    procs = [(g, p) for g in gpus for p in g.processes]
    for g, p in procs:
        lines.append(f"{g.index:>3}  {p.pid:>8}  {p.kind:<4}  {p.name[:32]:<32} {mib(p.used_mib)}")
    if not procs:
        lines.append("  No running processes found")
    return lines


def run(argv: list[str]) -> list[str]:
    opts = parse_args(argv)
    if opts["mode"] == "version":
        return ["NVIDIA-SMI version  : gpuclaim simulator"]
    node = os.environ.get("GPUCLAIM_NODE") or socket.gethostname().split(".")[0]
    driver, entry = load_node(node)
    delay = float(entry.get("delay_ms") or 0)
    if delay > 0:
        time.sleep(delay / 1000.0)
    if entry.get("fail"):
        raise Exit(EXIT_NO_DRIVER, NO_DRIVER_MESSAGE)
    all_gpus = build_gpus(node, entry)
    if not all_gpus:
        raise Exit(EXIT_NOT_FOUND, "No devices were found")
    gpus = select(all_gpus, opts["ids"])
    ctx = Context(driver, all_gpus)
    if opts["mode"] == "list":
        return [line for g in gpus for line in listed(g)]
    if opts["mode"] == "gpu":
        rows = [(ctx, g) for g in gpus]
        return csv_lines(opts["fields"], GPU_FIELDS, GPU_ALIASES, rows, opts["format"])
    if opts["mode"] == "apps":
        apps = [(ctx, g, p) for g in gpus for p in g.processes if "C" in p.kind]
        return csv_lines(opts["fields"], APP_FIELDS, APP_ALIASES, apps, opts["format"])
    if opts["mode"] == "query":
        return query_xml(ctx, gpus)
    return summary(ctx, gpus, node)


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        lines = run(args)
    except Exit as exc:
        if exc.message:
            print(exc.message, file=sys.stderr if exc.stderr else sys.stdout, flush=True)
        return exc.code
    try:
        sys.stdout.write("".join(line + "\n" for line in lines))
        sys.stdout.flush()
    except BrokenPipeError:  # `nvidia-smi | head -1`: exit quietly like the real tool
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
