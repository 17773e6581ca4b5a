"""What one probe of one node returns: its GPUs, their processes, or why there are none.

The node agent builds these and sends ``to_dict()``; the CLI reads them back with
``from_dict``. Standard library only, Python 3.9 (it runs on the nodes), and only what a
probe needs: a node's first look imports this and not the rest of ``core.model``.

They are frozen records as ``@dataclass(frozen=True)`` makes them (fields, defaults, ``==``,
``hash``, ``repr``, and ``replace``), written out because ``dataclasses`` imports
``inspect``: 7 of the ~50 ms a node's first look spends importing, on every node at once.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing on the node
if TYPE_CHECKING:
    from typing import Any, ClassVar, Optional, TypeVar

    R = TypeVar("R", bound="_Record")


def opt_int(value: Any) -> Optional[int]:
    if value is None or value == "":
        return None
    return int(value)


class _Record:
    """Frozen: fields set once, by ``__init__``; equal when of one class with equal fields."""

    __slots__ = ()
    FIELDS: ClassVar[tuple[str, ...]] = ()

    def _set(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, _Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.FIELDS)
        return f"{type(self).__name__}({shown})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return type(self), self._values()  # copy, deepcopy and pickle: through __init__

    def replace(self: R, **changes: Any) -> R:
        """A copy with ``changes`` (``dataclasses.replace``)."""
        values = {name: getattr(self, name) for name in self.FIELDS}
        values.update(changes)
        return type(self)(**values)


class GpuProcess(_Record):
    """A process seen on a GPU by NVML or nvidia-smi."""

    FIELDS = ("pid", "name", "used_memory_mib", "user", "gpu_uuid", "kind")
    __slots__ = FIELDS
    pid: int
    name: str
    used_memory_mib: Optional[int]  # None: the driver does not say (WDDM, [N/A])
    user: Optional[str]  # mapped from /proc on the node; None if unknown
    gpu_uuid: Optional[str]
    kind: str  # C compute, G graphics, C+G both

    def __init__(
        self,
        pid: int,
        name: str,
        used_memory_mib: Optional[int] = None,
        user: Optional[str] = None,
        gpu_uuid: Optional[str] = None,
        kind: str = "C",
    ) -> None:
        self._set(
            pid=pid,
            name=name,
            used_memory_mib=used_memory_mib,
            user=user,
            gpu_uuid=gpu_uuid,
            kind=kind,
        )

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.FIELDS}

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


class Gpu(_Record):
    """One GPU on one node as probed, or one MIG slice of one: a GPU in MIG mode is not
    claimable whole, so a probe lists its slices instead, each with its own (``MIG-``) UUID,
    ``index`` its parent's, ``mig`` its number under the parent (``nvidia-smi -L``'s
    ``Device N``) and ``parent_uuid``."""

    FIELDS = (
        "node",
        "index",
        "uuid",
        "name",
        "memory_total_mib",
        "memory_used_mib",
        "utilization_pct",
        "pci_bus_id",
        "mig_mode",
        "mig_devices",
        "processes",
        "mig",
        "mig_profile",
        "parent_uuid",
    )
    __slots__ = FIELDS
    node: str
    index: int
    uuid: str
    name: str
    memory_total_mib: Optional[int]  # None on unified-memory parts (GB10)
    memory_used_mib: Optional[int]
    utilization_pct: Optional[int]  # None under MIG or when not supported
    pci_bus_id: Optional[str]
    mig_mode: Optional[bool]
    mig_devices: tuple[str, ...]  # MIG instance UUIDs or profile names
    processes: tuple[GpuProcess, ...]
    mig: Optional[int]  # a slice: its number under its GPU
    mig_profile: Optional[str]  # a slice: "3g.40gb"
    parent_uuid: Optional[str]  # a slice: its GPU's UUID

    def __init__(
        self,
        node: str,
        index: int,
        uuid: str,
        name: str,
        memory_total_mib: Optional[int] = None,
        memory_used_mib: Optional[int] = None,
        utilization_pct: Optional[int] = None,
        pci_bus_id: Optional[str] = None,
        mig_mode: Optional[bool] = None,
        mig_devices: tuple[str, ...] = (),
        processes: tuple[GpuProcess, ...] = (),
        mig: Optional[int] = None,
        mig_profile: Optional[str] = None,
        parent_uuid: Optional[str] = None,
    ) -> None:
        self._set(
            node=node,
            index=index,
            uuid=uuid,
            name=name,
            memory_total_mib=memory_total_mib,
            memory_used_mib=memory_used_mib,
            utilization_pct=utilization_pct,
            pci_bus_id=pci_bus_id,
            mig_mode=mig_mode,
            mig_devices=mig_devices,
            processes=processes,
            mig=mig,
            mig_profile=mig_profile,
            parent_uuid=parent_uuid,
        )

    @property
    def label(self) -> str:
        """How people name it: ``0``, or ``0/1`` for slice 1 of GPU 0."""
        return gpu_label(self.index, self.mig)

    @property
    def mig_parent(self) -> bool:
        """A GPU in MIG mode itself (never handed out whole: its slices are)."""
        return bool(self.mig_mode) and self.mig is None

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in self.FIELDS}
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
            mig=opt_int(d.get("mig")),
            mig_profile=d.get("mig_profile"),
            parent_uuid=d.get("parent_uuid"),
        )


def gpu_label(index: int, mig: Optional[int] = None) -> str:
    """``0`` for a GPU, ``0/1`` for slice 1 of GPU 0 (``--gpu node01:0/1``)."""
    return str(index) if mig is None else f"{index}/{mig}"


def label_order(label: str) -> tuple[int, int]:
    """Sort key of a label: GPUs by index, a GPU's slices after it, by number."""
    head, _, tail = label.partition("/")
    return int(head), int(tail) if tail else -1


class NodeInventory(_Record):
    """What one probe of one node returned: its GPUs, or why there are none."""

    FIELDS = ("node", "gpus", "source", "driver_version", "error", "reachable", "liveness")
    __slots__ = FIELDS
    node: str
    gpus: tuple[Gpu, ...]
    source: str  # "nvml", "nvidia-smi", ...
    driver_version: Optional[str]
    error: Optional[str]  # set when the node or its driver could not be read
    reachable: bool
    # The node's boot id and running job wrappers (gpuclaim.core.liveness), when it could tell.
    liveness: Optional[dict[str, Any]]

    def __init__(
        self,
        node: str,
        gpus: tuple[Gpu, ...] = (),
        source: str = "",
        driver_version: Optional[str] = None,
        error: Optional[str] = None,
        reachable: bool = True,
        liveness: Optional[dict[str, Any]] = None,
    ) -> None:
        self._set(
            node=node,
            gpus=gpus,
            source=source,
            driver_version=driver_version,
            error=error,
            reachable=reachable,
            liveness=liveness,
        )

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
