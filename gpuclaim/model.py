"""The domain, as frozen dataclasses with one JSON shape.

The same ``to_dict`` shape is printed by ``--json``, written to the claim files on shared
storage and sent back by the node agent, so it must stay importable on a node's Python 3.9
with nothing but the standard library.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

GPU_STATES = ("free", "claimed", "busy-unclaimed", "stale", "unreachable")


def iso(ts: Optional[float]) -> Optional[str]:
    """Epoch seconds -> ISO 8601 in UTC with a Z, as used in every JSON shape."""
    if ts is None:
        return None
    when = dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_iso(value: Any) -> Optional[float]:
    """ISO 8601 (or epoch number) -> epoch seconds; None stays None."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    when = dt.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


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
            used_memory_mib=_opt_int(d.get("used_memory_mib")),
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
            memory_total_mib=_opt_int(d.get("memory_total_mib")),
            memory_used_mib=_opt_int(d.get("memory_used_mib")),
            utilization_pct=_opt_int(d.get("utilization_pct")),
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpus": [g.to_dict() for g in self.gpus],
            "source": self.source,
            "driver_version": self.driver_version,
            "error": self.error,
            "reachable": self.reachable,
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
        )


@dataclass(frozen=True)
class ClaimedGpu:
    """One GPU inside a claim: the UUID is the key, node and index are for people."""

    uuid: str
    index: int

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": self.uuid, "index": self.index}


@dataclass(frozen=True)
class Claim:
    """A user's hold on one or more GPUs of one node, until ``expires`` (storage clock)."""

    id: str
    user: str
    node: str
    gpus: tuple[ClaimedGpu, ...]
    since: float
    expires: float
    note: str = ""
    job: Optional[str] = None
    host: str = ""  # where the claiming process ran
    pid: int = 0
    adopted: bool = False

    @property
    def indices(self) -> list[int]:
        return sorted(g.index for g in self.gpus)

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]

    def with_expiry(self, expires: float) -> Claim:
        return replace(self, expires=expires)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "node": self.node,
            "gpus": self.indices,
            "gpu_uuids": [g.uuid for g in sorted(self.gpus, key=lambda g: g.index)],
            "since": iso(self.since),
            "expires": iso(self.expires),
            "note": self.note,
            "job": self.job,
            "host": self.host,
            "pid": self.pid,
            "adopted": self.adopted,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        indices = [int(i) for i in d["gpus"]]
        uuids = [str(u) for u in d["gpu_uuids"]]
        if len(indices) != len(uuids) or not uuids:
            raise ValueError("gpus and gpu_uuids differ in length")
        since = parse_iso(d["since"])
        expires = parse_iso(d["expires"])
        if since is None or expires is None:
            raise ValueError("since and expires are required")
        return cls(
            id=str(d["id"]),
            user=str(d["user"]),
            node=str(d["node"]),
            gpus=tuple(ClaimedGpu(u, i) for u, i in zip(uuids, indices)),
            since=since,
            expires=expires,
            note=str(d.get("note") or ""),
            job=d.get("job"),
            host=str(d.get("host") or ""),
            pid=int(d.get("pid") or 0),
            adopted=bool(d.get("adopted", False)),
        )


@dataclass(frozen=True)
class Event:
    """One line of the append-only event log (the accounting history)."""

    ts: float
    type: str  # claim, release, expire, force-release, extend, drain, undrain, reap
    user: str
    claim_id: Optional[str] = None
    node: Optional[str] = None
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    since: Optional[float] = None
    expires: Optional[float] = None
    by: Optional[str] = None  # who did it, when not the holder (force, gc)
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ts": iso(self.ts),
            "type": self.type,
            "user": self.user,
            "claim_id": self.claim_id,
            "node": self.node,
            "gpus": list(self.gpus),
            "gpu_uuids": list(self.gpu_uuids),
            "since": iso(self.since),
            "expires": iso(self.expires),
            "by": self.by,
            "reason": self.reason,
            **({"extra": self.extra} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        ts = parse_iso(d["ts"])
        if ts is None:
            raise ValueError("event without ts")
        return cls(
            ts=ts,
            type=str(d["type"]),
            user=str(d.get("user", "")),
            claim_id=d.get("claim_id"),
            node=d.get("node"),
            gpus=tuple(int(i) for i in d.get("gpus") or ()),
            gpu_uuids=tuple(str(u) for u in d.get("gpu_uuids") or ()),
            since=parse_iso(d.get("since")),
            expires=parse_iso(d.get("expires")),
            by=d.get("by"),
            reason=str(d.get("reason") or ""),
            extra=dict(d.get("extra") or {}),
        )


def _opt_int(value: Any) -> Optional[int]:
    if value is None or value == "":
        return None
    return int(value)
