"""What a look at the store returns: claim files as read, claims as judged, the snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.booking import Booking
from gpuclaim.core.model import Claim
from gpuclaim.core.records import Drain


@dataclass(frozen=True)
class ClaimFile:
    """One ``gpus/<uuid>.claim`` as read back: a claim, or why it could not be parsed."""

    uuid: str
    path: Path
    mtime: float
    inode: int
    claim: Optional[Claim] = None
    error: Optional[str] = None

    @property
    def unreadable(self) -> bool:
        """Present but not ours to read (or the server failed us): held by someone unknown."""
        return self.claim is None and (self.error or "").startswith("unreadable")

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "path": str(self.path),
            "mtime": self.mtime,
            "inode": self.inode,
            "claim": self.claim.to_dict() if self.claim else None,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimFile:
        return cls(
            uuid=str(d["uuid"]),
            path=Path(d["path"]),
            mtime=float(d["mtime"]),
            inode=int(d["inode"]),
            claim=Claim.from_dict(d["claim"]) if d.get("claim") else None,
            error=d.get("error"),
        )


@dataclass(frozen=True)
class ClaimStatus:
    """How the store judges one claim right now."""

    claim: Claim
    state: str  # GpuState.CLAIMED or GpuState.STALE (a plain str once it crossed the wire)
    reason: str = ""  # "expired", "incomplete", "in progress"
    present: tuple[str, ...] = ()  # uuids whose files hold this claim


@dataclass
class Snapshot:
    """Everything in the store at one moment, judged against the storage clock ``now``."""

    now: float
    files: dict[str, ClaimFile] = field(default_factory=dict)  # by GPU uuid
    claims: dict[str, ClaimStatus] = field(default_factory=dict)  # by claim id
    drains: dict[str, Drain] = field(default_factory=dict)  # by node
    # job wrappers' heartbeats by claim id: {"mtime", "interval", "boot_id", "pid", "start"}
    beats: dict[str, dict[str, Any]] = field(default_factory=dict)
    bookings: list[Booking] = field(default_factory=list)  # live ones (reserve)
    shares: dict[str, list[ClaimFile]] = field(default_factory=dict)  # by GPU uuid (--gpu-mem)

    def claim_for(self, gpu_uuid: str) -> Optional[ClaimStatus]:
        f = self.files.get(gpu_uuid)
        if f is None or f.claim is None:
            return None
        return self.claims.get(f.claim.id)

    def shares_of(self, gpu_uuid: str) -> list[ClaimStatus]:
        """The shares a GPU's memory is held by, as judged (stale ones included)."""
        found = []
        for f in self.shares.get(gpu_uuid, ()):
            status = self.claims.get(f.claim.id) if f.claim is not None else None
            if status is not None:
                found.append(status)
        return found

    def damaged_shares(self, gpu_uuid: str) -> list[ClaimFile]:
        return [f for f in self.shares.get(gpu_uuid, ()) if f.claim is None]

    def corrupt(self) -> list[ClaimFile]:
        """Damaged claim files (they parse as no claim): reclaimable. Unreadable ones are not."""
        every = [*self.files.values(), *(f for fs in self.shares.values() for f in fs)]
        return [f for f in every if f.claim is None and not f.unreadable]

    def to_dict(self) -> dict[str, Any]:
        """The wire shape the node agent sends for storage over SSH."""
        return {
            "now": self.now,
            "files": [f.to_dict() for f in self.files.values()],
            "claims": [
                {
                    "claim": s.claim.to_dict(),
                    "state": s.state,
                    "reason": s.reason,
                    "present": list(s.present),
                }
                for s in self.claims.values()
            ],
            "drains": self.drains,
            "beats": self.beats,
            "bookings": [b.to_record() for b in self.bookings],
            "shares": [f.to_dict() for fs in self.shares.values() for f in fs],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Snapshot:
        files = [ClaimFile.from_dict(f) for f in d.get("files") or ()]
        claims = [
            ClaimStatus(
                Claim.from_dict(c["claim"]),
                str(c["state"]),
                str(c.get("reason") or ""),
                tuple(c.get("present") or ()),
            )
            for c in d.get("claims") or ()
        ]
        shares: dict[str, list[ClaimFile]] = {}
        for raw in d.get("shares") or ():
            share = ClaimFile.from_dict(raw)
            shares.setdefault(share.uuid, []).append(share)
        return cls(
            now=float(d["now"]),
            files={f.uuid: f for f in files},
            claims={c.claim.id: c for c in claims},
            drains=dict(d.get("drains") or {}),
            beats=dict(d.get("beats") or {}),
            bookings=[Booking.from_record(b) for b in d.get("bookings") or ()],
            shares=shares,
        )
