"""A service as ``status``, ``jobs`` and the board show it: where it answers, how it does, how
long its process has been up and how often it was started again."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional

from gpuclaim.core.durations import format_duration
from gpuclaim.core.model import Job, iso
from gpuclaim.core.states import ServiceHealth, started
from gpuclaim.engine.job_records import observed_health


@dataclass(frozen=True)
class ServiceRow:
    """One service as ``jobs`` and ``status`` show it."""

    job_id: str
    name: str
    user: str
    node: str
    gpus: tuple[int, ...]
    port: int
    url: str
    health: str  # a ServiceHealth
    restarts: int
    up_since: Optional[float]  # its process's last (re)start (storage clock)

    def up_for(self, now: float) -> Optional[float]:
        """How long it has run since its last start; None while it is not running."""
        if self.up_since is None or self.health in (ServiceHealth.RESTARTING, ServiceHealth.DOWN):
            return None
        return max(0.0, now - self.up_since)

    def summary(self, now: float) -> str:
        """``healthy · up 3h 2m · 1 restart``."""
        parts = [self.health]
        up = self.up_for(now)
        if up is not None:
            parts.append(f"up {format_duration(up)}")
        if self.restarts:
            parts.append(f"{self.restarts} restart{'s' if self.restarts != 1 else ''}")
        return " · ".join(parts)

    def to_dict(self, now: float) -> dict[str, Any]:
        up = self.up_for(now)
        return {
            "job_id": self.job_id,
            "name": self.name,
            "user": self.user,
            "node": self.node,
            "gpus": list(self.gpus),
            "port": self.port,
            "url": self.url,
            "health": self.health,
            "restarts": self.restarts,
            "up_since": iso(self.up_since),
            "up_s": None if up is None else round(up, 1),
        }


def service_row(job: Job, claims: dict[str, Any]) -> Optional[ServiceRow]:
    """The row of a started service (None for other jobs and ended ones)."""
    if job.service is None or not started(job.state) or not job.ranks:
        return None
    rank = job.ranks[0]
    return ServiceRow(
        job_id=job.id,
        name=job.name,
        user=job.user,
        node=rank.node,
        gpus=tuple(rank.gpus),
        port=job.service.port,
        url=job.service.url(rank.node),
        health=observed_health(job, claims) or ServiceHealth.STARTING.value,
        restarts=job.restarts,
        up_since=job.up_since,
    )


def service_rows(jobs: Iterable[Job], claims: dict[str, Any]) -> list[ServiceRow]:
    """The started services among ``jobs``, by node and name."""
    rows = [r for r in (service_row(j, claims) for j in jobs) if r is not None]
    return sorted(rows, key=lambda r: (r.node, r.name, r.user))
