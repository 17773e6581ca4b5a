"""The domain, as frozen dataclasses with one JSON shape.

The same ``to_dict`` shape is printed by ``--json``, written to the claim files on shared
storage and sent back by the node agent, so it must stay importable on a node's Python 3.9
with nothing but the standard library. Jobs live in ``job``, the records' words in
``words``; both are re-exported here: they are the domain too.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

# What a probe of a node returns: its own module, so that a node's first look at its GPUs
# does not pay for defining every other dataclass here. Re-exported: they are the domain too.
from gpuclaim.core.inventory import Gpu, GpuProcess, NodeInventory, gpu_label, opt_int
from gpuclaim.core.job import (
    PREEMPT_SIGNALS,
    ArrayRef,
    Dependency,
    Job,
    JobRank,
    JobUpdate,
)
from gpuclaim.core.words import EventType, JobKind, event_type, iso, job_kind, parse_iso

__all__ = [
    "PREEMPT_SIGNALS",
    "ArrayRef",
    "Dependency",
    "EventType",
    "Gpu",
    "GpuProcess",
    "Job",
    "JobKind",
    "JobRank",
    "JobUpdate",
    "NodeInventory",
    "event_type",
    "iso",
    "job_kind",
    "opt_int",
    "parse_iso",
]


@dataclass(frozen=True)
class ClaimedGpu:
    """One GPU inside a claim: the UUID is the key, node and index are for people."""

    uuid: str
    index: int
    mig: Optional[int] = None  # a MIG slice of GPU ``index``: its number there

    @property
    def label(self) -> str:
        return gpu_label(self.index, self.mig)

    @property
    def visible(self) -> str:
        """Its CUDA_VISIBLE_DEVICES entry: the index, or a slice's MIG UUID (CUDA names
        MIG devices only so)."""
        return self.uuid if self.mig is not None else str(self.index)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"uuid": self.uuid, "index": self.index}
        if self.mig is not None:
            d["mig"] = self.mig
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimedGpu:
        return cls(str(d["uuid"]), int(d["index"]), opt_int(d.get("mig")))


class HoldsGpus:
    """What a claim and a booking both are: some GPUs of one node (``self.gpus``)."""

    gpus: tuple[ClaimedGpu, ...]

    @property
    def indices(self) -> list[int]:
        return sorted(g.index for g in self.gpus)

    @property
    def ordered(self) -> list[ClaimedGpu]:
        """Its GPUs by index, a GPU's slices by number."""
        return sorted(self.gpus, key=lambda g: (g.index, -1 if g.mig is None else g.mig))

    @property
    def labels(self) -> list[str]:
        """``0``, ``1`` or ``0/1`` (a MIG slice), in order: how people name them."""
        return [g.label for g in self.ordered]

    @property
    def visible(self) -> str:
        """CUDA_VISIBLE_DEVICES for exactly these GPUs (indices, or MIG UUIDs)."""
        return ",".join(g.visible for g in self.ordered)

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]


@dataclass(frozen=True)
class Claim(HoldsGpus):
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
    preemptible: bool = False  # a run --preemptible job's: it yields to anyone's claim
    keep_when_idle: bool = False  # a service's (serve): the idle policy never releases it
    service: bool = False  # a service's: kept while it should run, its node gone or not
    # A share (claim --gpu-mem/--gpu-share): this much of one GPU's memory, the GPU held by
    # other shares too, never whole; 0 for a whole claim. The total is the GPU's as placed.
    mem_mib: int = 0
    mem_total_mib: int = 0

    @property
    def shared(self) -> bool:
        return self.mem_mib > 0

    @property
    def fraction(self) -> float:
        """How much of its GPUs it holds: 1 whole, a share's part of its GPU's memory."""
        if not self.shared or self.mem_total_mib <= 0:
            return 1.0
        return min(1.0, self.mem_mib / self.mem_total_mib)

    @property
    def gpu_weight(self) -> float:
        """GPUs held, a share counted by its part (limits, fair share, accounting)."""
        return len(self.gpus) * self.fraction

    def _slices(self) -> dict[str, Any]:
        """``gpu_migs`` beside ``gpus`` where it holds MIG slices (else nothing: older
        readers of whole claims see the records they know)."""
        if all(g.mig is None for g in self.gpus):
            return {}
        return {"gpu_migs": [g.mig for g in self.ordered]}

    def with_expiry(self, expires: float) -> Claim:
        return replace(self, expires=expires)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "node": self.node,
            "gpus": [g.index for g in self.ordered],
            "gpu_uuids": [g.uuid for g in self.ordered],
            **self._slices(),
            "since": iso(self.since),
            "expires": iso(self.expires),
            "note": self.note,
            "job": self.job,
            "host": self.host,
            "pid": self.pid,
            "adopted": self.adopted,
            "preemptible": self.preemptible,
            "keep_when_idle": self.keep_when_idle,
            "service": self.service,
            "mem_mib": self.mem_mib,
            "mem_total_mib": self.mem_total_mib,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        indices = [int(i) for i in d["gpus"]]
        uuids = [str(u) for u in d["gpu_uuids"]]
        migs = [opt_int(m) for m in d.get("gpu_migs") or [None] * len(uuids)]
        if len(indices) != len(uuids) or len(migs) != len(uuids) or not uuids:
            raise ValueError("gpus and gpu_uuids differ in length")
        since = parse_iso(d["since"])
        expires = parse_iso(d["expires"])
        if since is None or expires is None:
            raise ValueError("since and expires are required")
        return cls(
            id=str(d["id"]),
            user=str(d["user"]),
            node=str(d["node"]),
            gpus=tuple(ClaimedGpu(u, i, m) for u, i, m in zip(uuids, indices, migs)),
            since=since,
            expires=expires,
            note=str(d.get("note") or ""),
            job=d.get("job"),
            host=str(d.get("host") or ""),
            pid=int(d.get("pid") or 0),
            adopted=bool(d.get("adopted", False)),
            preemptible=bool(d.get("preemptible", False)),
            keep_when_idle=bool(d.get("keep_when_idle", False)),
            service=bool(d.get("service", False)),
            mem_mib=int(d.get("mem_mib") or 0),
            mem_total_mib=int(d.get("mem_total_mib") or 0),
        )


@dataclass(frozen=True)
class Event:
    """One line of the append-only event log (the accounting history)."""

    ts: float
    type: str  # an EventType; from the log, its text (a newer gpuclaim's type is kept)
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
