"""Keeping a service up (``gpuclaim serve``), inside its wrapper on the node.

The command is started again when it exits (as its restart policy says) or stops answering
its health check (an HTTP GET of ``http://127.0.0.1:PORT/PATH``, else a TCP connect to the
port), after a backoff of 1 s doubling to 60 s (back to 1 s after 10 healthy minutes). More
than ``max_restarts`` restarts within 10 minutes: it gives up and ends ``failed``, its GPUs
released. Its health and restarts are written to the job's record as they change, so
``jobs`` shows them with nobody on the node. Standard library only, Python 3.9.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.model import Event, EventType, iso
from gpuclaim.core.service import (
    HEALTH_FAILURES,
    HEALTH_TIMEOUT_S,
    RESTART_WINDOW_S,
    ServiceSpec,
    next_backoff,
    should_restart,
)
from gpuclaim.core.states import JobState, ServiceHealth

if TYPE_CHECKING:
    from gpuclaim.node.child import ChildRun

STARTING_CHECK_S = 1.0  # while it starts, it is asked this often (then every interval)


class HealthWatch:
    """One run's health: when to ask, what it answered, and when it must restart."""

    def __init__(self, spec: ServiceSpec, started: float, record: Any) -> None:
        self.spec = spec
        self.started = started
        self.record = record  # record(health): the job's record is told of a change
        self.state = ServiceHealth.STARTING
        self.answered = False
        self.failures = 0
        self.next_check = started + STARTING_CHECK_S
        self.healthy_since: Optional[float] = None

    def step(self, now: float) -> Optional[str]:
        """Ask if it is time; why it must restart, or None."""
        if now < self.next_check:
            return None
        ok = probe(self.spec, min(HEALTH_TIMEOUT_S, self.spec.health_interval_s))
        now = time.monotonic()
        interval = self.spec.health_interval_s
        self.next_check = now + (interval if self.answered else min(interval, STARTING_CHECK_S))
        if ok:
            self.failures = 0
            self.answered = True
            if self.healthy_since is None:
                self.healthy_since = now
            self._set(ServiceHealth.HEALTHY)
            return None
        self.healthy_since = None
        if not self.answered:
            if now - self.started > self.spec.health_start_s:
                return f"no answer on port {self.spec.port} within its start time"
            return None
        self.failures += 1
        self._set(ServiceHealth.UNHEALTHY)
        if self.failures >= HEALTH_FAILURES:
            return f"{self.failures} health checks failed in a row"
        return None

    def healthy_for(self, now: float) -> float:
        return 0.0 if self.healthy_since is None else now - self.healthy_since

    def _set(self, state: ServiceHealth) -> None:
        if state != self.state:
            self.state = state
            self.record(state)


def probe(spec: ServiceSpec, timeout: float) -> bool:
    """Does it answer: an HTTP GET of its health path (2xx or 3xx), else a TCP connect."""
    if spec.health_path is None:
        try:
            with socket.create_connection(("127.0.0.1", spec.port), timeout=timeout):
                return True
        except OSError:
            return False
    import urllib.error
    import urllib.request

    path = spec.health_path if spec.health_path.startswith("/") else "/" + spec.health_path
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{spec.port}{path}", timeout=timeout) as r:
            return 200 <= int(r.status) < 400
    except urllib.error.HTTPError:
        return False
    except (OSError, ValueError):
        return False


def keep_up(w: ChildRun, argv: list[str], env: dict[str, str], log: Any, deadline: float) -> int:
    """Run the service (already started once) until it is stopped, gives up, or ends as its
    restart policy says; the exit code of ``Wrapper.run``."""
    spec = w.job.service
    assert spec is not None
    restarts = w.job.restarts
    backoff = 0.0
    recent: list[float] = []  # when it was restarted, within the window
    running = True  # False: its last start failed at once (its program went away)
    outage = _Outage(w, down=bool(w.spec.get("revived")))  # its node rebooted: back, once up
    while True:
        health = HealthWatch(spec, time.monotonic(), lambda h, n=restarts: outage.health(h, n))
        if running:
            _record(w, health=ServiceHealth.STARTING, up_since=w.store.now())
            unhealthy = w._watch(log, deadline, health)
            code = w._reap_child()
        else:
            unhealthy, code = False, 127
        exit_code = code if code >= 0 else 128 - code
        if w.stop_reason is not None:  # kill, its time limit, preemption: it ends
            _record(w, health=None)
            return w._record_end(code)
        if not unhealthy and not should_restart(spec.restart, exit_code, False):
            _record(w, health=None)
            return w._record_end(code)
        now = time.monotonic()
        cause = "it stopped answering" if unhealthy else f"it exited with status {exit_code}"
        recent = [t for t in recent if now - t < RESTART_WINDOW_S]
        if len(recent) >= spec.max_restarts:
            reason = (
                f"gave up: {len(recent)} restarts within {RESTART_WINDOW_S / 60:.0f} minutes "
                f"(the last: {cause})"
            )
            log.write(f"gpuclaim: {reason}\n".encode())
            _record(w, health=None)
            return w._finish(JobState.FAILED, exit_code, reason)
        backoff = next_backoff(backoff, health.healthy_for(now))
        outage.down(cause)
        restarts += 1
        recent.append(now)
        log.write(f"gpuclaim: {cause}; restart {restarts} in {backoff:g}s\n".encode())
        _record(w, health=ServiceHealth.RESTARTING, restarts=restarts)
        if not _wait(w, backoff, deadline):
            _record(w, health=None)
            reason = w.kill_reason()
            state = JobState.TIMEOUT if w.stop_reason == JobState.TIMEOUT else JobState.KILLED
            return w._finish(state, None, reason)
        running = w._start_child(argv, env, log) is None


class _Outage:
    """Slack hears once that it went down and once that it is back (not of every restart of
    a crash loop); the job's record hears of every change of its health."""

    def __init__(self, w: ChildRun, down: bool = False) -> None:
        self.w = w
        self.is_down = down

    def health(self, state: ServiceHealth, restarts: int) -> None:
        _record(self.w, health=state)
        if state == ServiceHealth.HEALTHY and self.is_down:
            self.is_down = False
            self._tell(EventType.SERVICE_BACK, "", restarts)

    def down(self, cause: str) -> None:
        if not self.is_down:
            self.is_down = True
            self._tell(EventType.SERVICE_DOWN, cause, None)

    def _tell(self, kind: EventType, reason: str, restarts: Optional[int]) -> None:
        w = self.w
        try:
            w.store.append_event(
                Event(
                    ts=w.store.now(),
                    type=kind,
                    user=w.job.user,
                    node=w.me.node,
                    gpus=tuple(w.me.gpus),
                    reason=reason,
                    extra={"job": w.job.name, "job_id": w.job.id, "restarts": restarts},
                )
            )
        except GpuclaimError:
            return  # the storage hiccuped: this one is not told
        threading.Thread(target=w._notify, daemon=True).start()


def _wait(w: ChildRun, seconds: float, deadline: float) -> bool:
    """Sleep before a restart, still beating and reading stop requests; False if stopped."""
    now = time.monotonic()
    until, next_beat = now + seconds, now + w.beat_s
    while time.monotonic() < until:
        time.sleep(min(0.5, max(0.0, until - time.monotonic())))
        w._check_stop_request()
        now = time.monotonic()
        if now > deadline + w.extended_s:
            w.stop_reason = JobState.TIMEOUT
        if w.stop_reason is not None:
            return False
        if now > next_beat:  # a minute's backoff must not look like a lost job
            next_beat = now + w.beat_s
            w._beat()
    return True


def _record(
    w: ChildRun,
    health: Optional[ServiceHealth],
    restarts: Optional[int] = None,
    up_since: Optional[float] = None,
) -> None:
    changes: dict[str, Any] = {"health": health.value if health is not None else None}
    if restarts is not None:
        changes["restarts"] = restarts
    if up_since is not None:
        changes["up_since"] = iso(up_since)
    try:
        w.store.update_job(job_id=w.job.id, changes=changes)
    except GpuclaimError:
        pass  # the storage hiccuped: the next change says it again
