"""What a node is made of, as SLURM's slurm.conf wants it: CPUs, their topology, memory, and
the device minor of each GPU. Runs on the node (agent op ``hardware``): standard library,
Python 3.9.

The numbers match what ``slurmd -C`` reports, except RealMemory, which is kept a little under
MemTotal: a node that reports less memory than configured (a new kernel, a reserved hugepage)
is drained by slurmctld, and a few GiB fewer costs nothing.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from gpuclaim.core.protocol import HardwareResponse

MEMORY_MARGIN = 0.02  # RealMemory headroom below MemTotal


def probe_hardware(root: str = "/") -> HardwareResponse:
    """CPUs, sockets, cores per socket, threads per core, memory and GPU minors of this host.

    ``sockets``, ``cores_per_socket`` and ``threads_per_core`` are None when the topology does
    not multiply out to the CPU count (hybrid P/E cores): then only CPUs can be configured.
    """
    base = Path(root)
    cpus = _online_cpus(base)
    topology = _topology_sys(base, cpus) or _topology_cpuinfo(base, len(cpus))
    sockets, cores_per_socket, threads_per_core = topology or (None, None, None)
    mem_total = _mem_total_mib(base)
    return {
        "hostname": socket.gethostname().split(".", 1)[0],
        "cpus": len(cpus),
        "sockets": sockets,
        "cores_per_socket": cores_per_socket,
        "threads_per_core": threads_per_core,
        "mem_total_mib": mem_total,
        "real_memory_mib": real_memory(mem_total) if mem_total else None,
        "gpu_minors": _gpu_minors(base),
    }


def real_memory(mem_total_mib: int) -> int:
    """RealMemory for slurm.conf: 2% under MemTotal, rounded down to a GiB when that leaves
    anything, so identical machines (whose MemTotal differs by a few MiB) get the same line."""
    value = int(mem_total_mib * (1 - MEMORY_MARGIN))
    return value // 1024 * 1024 if value >= 4096 else max(1, value)


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8,10-11`` (the kernel's list format) -> [0, 1, 2, 3, 8, 10, 11]."""
    result: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            result.extend(range(int(lo), int(hi) + 1))
        else:
            result.append(int(part))
    return result


def _online_cpus(base: Path) -> list[int]:
    # All online CPUs of the host, as slurmd counts them: not this process's affinity mask.
    try:
        return parse_cpu_list((base / "sys/devices/system/cpu/online").read_text())
    except (OSError, ValueError):
        return list(range(os.cpu_count() or 1))


def _topology_sys(base: Path, cpus: list[int]) -> Optional[tuple[int, int, int]]:
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topo = base / f"sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            package = (topo / "physical_package_id").read_text().strip()
            core = (topo / "core_id").read_text().strip()
        except OSError:
            return None
        cores.add((package, core))
    return _consistent(len(cpus), {p for p, _ in cores}, cores)


def _topology_cpuinfo(base: Path, ncpus: int) -> Optional[tuple[int, int, int]]:
    try:
        text = (base / "proc/cpuinfo").read_text()
    except OSError:
        return None
    cores: set[tuple[str, str]] = set()
    for block in text.split("\n\n"):
        fields = {
            k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())
        }
        if "physical id" in fields and "core id" in fields:
            cores.add((fields["physical id"], fields["core id"]))
    if not cores:
        return None
    return _consistent(ncpus, {p for p, _ in cores}, cores)


def _consistent(
    ncpus: int, packages: set[str], cores: set[tuple[str, str]]
) -> Optional[tuple[int, int, int]]:
    """(sockets, cores per socket, threads per core) if they multiply out to the CPU count."""
    sockets = len(packages)
    if not sockets or len(cores) % sockets or ncpus % len(cores):
        return None
    cores_per_socket = len(cores) // sockets
    threads = ncpus // len(cores)
    per_socket = [sum(1 for p, _ in cores if p == pkg) for pkg in packages]
    if any(n != cores_per_socket for n in per_socket):
        return None  # uneven sockets: SLURM cannot describe them with one CoresPerSocket
    return sockets, cores_per_socket, threads


def _mem_total_mib(base: Path) -> Optional[int]:
    try:
        text = (base / "proc/meminfo").read_text()
    except OSError:
        return None
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) // 1024 if m else None


def _gpu_minors(base: Path) -> dict[str, int]:
    """{GPU UUID or PCI bus id: /dev/nvidiaN minor} from the driver's /proc files. The minor
    is not the nvidia-smi index (it follows the driver's probe order), and gres.conf's File=
    must name the right device file for each GPU type."""
    minors: dict[str, int] = {}
    gpus = base / "proc/driver/nvidia/gpus"
    try:
        entries = sorted(gpus.iterdir())
    except OSError:
        return minors
    for entry in entries:
        try:
            text = (entry / "information").read_text()
        except OSError:
            continue
        m = re.search(r"^Device Minor:\s*(\d+)", text, re.MULTILINE)
        if not m:
            continue
        minor = int(m.group(1))
        minors[normalize_bus_id(entry.name)] = minor
        uuid = re.search(r"^GPU UUID:\s*(\S+)", text, re.MULTILINE)
        if uuid:
            minors[uuid.group(1)] = minor
    return minors


def normalize_bus_id(bus_id: str) -> str:
    """``00000000:0C:00.0`` (nvidia-smi) and ``0000:0c:00.0`` (/proc) -> ``0000:0c:00.0``."""
    m = re.match(r"^(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)$", bus_id)
    if not m:
        return bus_id.lower()
    domain, bus, dev, fn = (int(x, 16) for x in (m.group(1) or "0", *m.group(2, 3, 4)))
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"
