"""A service (``gpuclaim serve``): a job that stays up, restarted when it dies or stops
answering, with a port on its node. What was asked is a ``ServiceSpec`` on the job record;
how it is doing (``health``) and how often it came back (``restarts``) are the job's own.

Standard library only, Python 3.9: the wrapper on the node keeps a service up."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Optional


class RestartPolicy(str, Enum):
    """When the wrapper starts a service's process again after it exited."""

    ON_FAILURE = "on-failure"  # a non-zero exit, or a signal gpuclaim did not send
    ALWAYS = "always"
    NEVER = "never"

    def __str__(self) -> str:
        return self.value


BACKOFF_FIRST_S = 1.0  # the first restart's wait; doubled each time, up to BACKOFF_MAX_S
BACKOFF_MAX_S = 60.0
STEADY_S = 600.0  # healthy this long: the backoff starts again at the first wait
RESTART_WINDOW_S = 600.0  # more than max_restarts restarts within this: it gives up
HEALTH_TIMEOUT_S = 5.0
HEALTH_FAILURES = 3  # failed checks in a row that make it restart


@dataclass(frozen=True)
class ServiceSpec:
    """What ``serve`` asked for: the port (chosen at submit for ``auto``), the health check
    (an HTTP path, else a TCP connect to the port), and when to restart."""

    port: int
    health_path: Optional[str] = None
    health_interval_s: float = 10.0
    health_start_s: float = 600.0  # a model loads for minutes: the first answer may take this
    restart: str = RestartPolicy.ON_FAILURE.value
    max_restarts: int = 10
    idle_release: bool = False  # the idle policy may release it (never, by default)

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}/"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServiceSpec:
        return cls(
            port=int(d["port"]),
            health_path=d.get("health_path"),
            health_interval_s=float(d.get("health_interval_s", 10.0)),
            health_start_s=float(d.get("health_start_s", 600.0)),
            restart=str(d.get("restart") or RestartPolicy.ON_FAILURE.value),
            max_restarts=int(d.get("max_restarts", 10)),
            idle_release=bool(d.get("idle_release", False)),
        )


def should_restart(policy: str, exit_code: int, signalled_by_us: bool) -> bool:
    """After the process exited with ``exit_code`` (128+N for a signal), not stopped by us."""
    if policy == RestartPolicy.ALWAYS:
        return True
    if policy == RestartPolicy.NEVER:
        return False
    return exit_code != 0 and not signalled_by_us


def next_backoff(previous: float, ran_s: float) -> float:
    """The wait before the next start: doubled, up to a minute; the first wait again after a
    run that lasted STEADY_S."""
    if ran_s >= STEADY_S or previous <= 0:
        return BACKOFF_FIRST_S
    return min(BACKOFF_MAX_S, previous * 2)
