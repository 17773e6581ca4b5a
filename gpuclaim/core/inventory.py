"""What one probe of one node returns: its GPUs, their processes, or why there are none.

The node agent builds these and sends ``to_dict()``; the CLI reads them back with
``from_dict``. Standard library only, Python 3.9 (it runs on the nodes), and only what a
probe needs: a node's first look imports this and not the rest of ``core.model``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional


def opt_int(value: Any) -> Optional[int]:
    if value is None or value == "":
        return None
    return int(value)


@dataclass(frozen=True)
class GpuProcess:
    """A process seen on a GPU by NVML or nvidia-smi."""

    pid: int
    name: str
    used_memory_mib: Optional[int] = None  # None: the driver does not say (WDDM, [N/A])
    user: Optional[str] = None  # mapped from /proc on the node; None if unknown
    gpu_uuid: Optional[str] = None
    kind: str = "C"  # C compute, G graphics, C+G both

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GpuProcess:
        return cls(
            pid=int(d["pid"]),
            name=str(d.get("name", "")),
            used_memory_mib=opt_int(d.get("used_memory_mib")),
            user=d.get("user"),
            gpu_uuid=d.get("gpu_uuid"),
            kind=str(d.get("kind", "C")),
        )


@dataclass(frozen=True)
class Gpu:
    """One physical GPU (or MIG parent) on one node, as probed."""

    node: str
    index: int
    uuid: str
    name: str
    memory_total_mib: Optional[int] = None  # None on unified-memory parts (GB10)
    memory_used_mib: Optional[int] = None
    utilization_pct: Optional[int] = None  # None under MIG or when not supported
    pci_bus_id: Optional[str] = None
    mig_mode: Optional[bool] = None
    mig_devices: tuple[str, ...] = ()  # MIG instance UUIDs or profile names
    processes: tuple[GpuProcess, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mig_devices"] = list(self.mig_devices)
        d["processes"] = [p.to_dict() for p in self.processes]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Gpu:
        return cls(
            node=str(d["node"]),
            index=int(d["index"]),
            uuid=str(d["uuid"]),
            name=str(d.get("name", "")),
            memory_total_mib=opt_int(d.get("memory_total_mib")),
            memory_used_mib=opt_int(d.get("memory_used_mib")),
            utilization_pct=opt_int(d.get("utilization_pct")),
            pci_bus_id=d.get("pci_bus_id"),
            mig_mode=d.get("mig_mode"),
            mig_devices=tuple(d.get("mig_devices") or ()),
            processes=tuple(GpuProcess.from_dict(p) for p in d.get("processes") or ()),
        )


@dataclass(frozen=True)
class NodeInventory:
    """What one probe of one node returned: its GPUs, or why there are none."""

    node: str
    gpus: tuple[Gpu, ...] = ()
    source: str = ""  # "nvml", "nvidia-smi", ...
    driver_version: Optional[str] = None
    error: Optional[str] = None  # set when the node or its driver could not be read
    reachable: bool = True
    # The node's boot id and running job wrappers (gpuclaim.core.liveness), when it could tell.
    liveness: Optional[dict[str, Any]] = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpus": [g.to_dict() for g in self.gpus],
            "source": self.source,
            "driver_version": self.driver_version,
            "error": self.error,
            "reachable": self.reachable,
            "liveness": self.liveness,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeInventory:
        return cls(
            node=str(d["node"]),
            gpus=tuple(Gpu.from_dict(g) for g in d.get("gpus") or ()),
            source=str(d.get("source", "")),
            driver_version=d.get("driver_version"),
            error=d.get("error"),
            reachable=bool(d.get("reachable", True)),
            liveness=d.get("liveness"),
        )
