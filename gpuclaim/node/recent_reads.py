"""The warm agent's last GPU read, reused for looks that allow it (``max_age_s``).

A look at a node costs the node a GPU read (``nvidia-smi`` started, or NVML asked) and a
walk of ``/proc``: milliseconds each, paid again by every look, while ``status`` in a loop,
the board and ``metrics`` ask the same node several times a second between them. A look's
request says how old an answer it accepts (``defaults.gpu_read_max_age``, 1 s); the warm
agent answers from its last read while that is young enough, and reads again in the
background once it is half that age, so the next look finds a fresh one. A request that
accepts none, or finds none young enough, waits for a read of its own, as before; or,
if one begun within the age it allows is still running, for that one's answer.

An answer from an earlier read is still a true answer for the moment it was read: its
``liveness.checked_from`` is when that read looked at ``/proc``, so a job started since is
never taken for lost. But one that shows a process that has ended since (a GPU's compute
app, a job's wrapper) is not reused: a job killed a moment ago would otherwise show its
GPUs busy with no claim, its claim released already. How old a read is counts from its
end, when nvidia-smi answered.

Standard library only, Python 3.9 (node side).
"""

from __future__ import annotations

import json
import os
import threading
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any, Callable, Optional


class RecentReads:
    """``answer(request)``: the probe's answer, from a read no older than the request allows."""

    def __init__(
        self,
        read: Callable[[dict[str, Any]], dict[str, Any]],
        still_true: Optional[Callable[[dict[str, Any]], bool]] = None,
    ) -> None:
        self._read = read  # the agent's own handling of a probe request
        self._still_true = still_true or processes_alive
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, dict[str, Any]]] = {}
        self._refreshing: set[str] = set()
        self._reading: dict[str, _Read] = {}  # the newest read in flight, by key

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        max_age = float(request.get("max_age_s") or 0)
        key = _key(request)
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            young = max_age > 0 and last is not None and now - last[0] <= max_age
            if young and last is not None and self._still_true(last[1]):
                if now - last[0] > max_age / 2 and key not in self._refreshing:
                    self._refreshing.add(key)
                    threading.Thread(target=self._refresh, args=(key, request), daemon=True).start()
                return last[1]
            flight = self._reading.get(key)
        if max_age > 0 and flight is not None and now - flight.began <= max_age:
            # a read begun since the age allowed: its answer will do, sooner than a read of
            # our own (a node whose nvidia-smi takes seconds, several people looking)
            shared = flight.wait(float(request.get("timeout") or 30))
            if shared is not None and "result" in shared and self._still_true(shared):
                return shared
        return self._read_now(key, request)

    def _read_now(self, key: str, request: dict[str, Any]) -> dict[str, Any]:
        flight = _Read(time.monotonic())
        with self._lock:
            self._reading[key] = flight
        answer: Optional[dict[str, Any]] = None
        try:
            answer = self._read(request)
        finally:
            with self._lock:
                if self._reading.get(key) is flight:
                    del self._reading[key]
            flight.done(answer)  # None: it failed; who shared it reads for themselves
        # its age counts from its answer: what nvidia-smi reports is read at its end (on a
        # node without persistence mode the 2 s before go to starting the driver), so a
        # read that takes longer than the age allowed can still be reused
        ended = time.monotonic()
        # an error (the agent's, or the GPUs' read: a hung nvidia-smi) is never reused:
        # the next look tries again
        if "result" in answer and not (answer["result"] or {}).get("error"):
            with self._lock:
                last = self._last.get(key)
                if last is None or last[0] < ended:
                    self._last[key] = (ended, answer)
        return answer

    def _refresh(self, key: str, request: dict[str, Any]) -> None:
        try:
            self._read_now(key, request)
        finally:
            with self._lock:
                self._refreshing.discard(key)


class _Read:
    """A read in flight, for looks that may share its answer."""

    def __init__(self, began: float) -> None:
        self.began = began
        self._done = threading.Event()
        self._answer: Optional[dict[str, Any]] = None

    def done(self, answer: Optional[dict[str, Any]]) -> None:
        self._answer = answer
        self._done.set()

    def wait(self, timeout: float) -> Optional[dict[str, Any]]:
        """Its answer; None if it did not come within ``timeout`` (a read that hangs)."""
        return self._answer if self._done.wait(timeout) else None


def processes_alive(answer: dict[str, Any]) -> bool:
    """Whether every process a probe's answer shows still runs: its GPUs' compute apps and
    its jobs' wrappers. One signal 0 each (EPERM: another user's, alive)."""
    result = answer.get("result") or {}
    pids = [p.get("pid") for g in result.get("gpus") or () for p in g.get("processes") or ()]
    pids += [w[0] for w in (result.get("liveness") or {}).get("wrappers") or ()]
    for pid in pids:
        try:
            if int(pid) <= 0:
                continue  # kill(0 or -1) would ask about groups, not one process
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except (OSError, TypeError, ValueError):
            continue  # not ours to signal, or not a pid we can check: taken as alive
    return True


def _key(request: dict[str, Any]) -> str:
    """What makes two looks the same read: all of the request but how old it may be."""
    return json.dumps(
        {k: v for k, v in request.items() if k != "max_age_s"}, sort_keys=True, default=str
    )
