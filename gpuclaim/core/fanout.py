"""Ask many nodes at once, with one overall deadline: every node gets a result or an error."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Generic, Optional, TypeVar

from gpuclaim.core.errors import GpuclaimError

T = TypeVar("T")
ENOUGH_AFTER_S = 0.3  # nodes still answering after this are "slow": is what we have enough?


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One node's answer: ``value``, or ``error`` (a sentence), and how long it took."""

    node: str
    value: Optional[T] = None
    error: Optional[str] = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def fan_out(
    nodes: Sequence[str],
    call: Callable[[str], T],
    deadline_s: float,
    enough: Optional[Callable[[dict[str, Outcome[T]]], bool]] = None,
) -> dict[str, Outcome[T]]:
    """Run ``call(node)`` for all nodes in parallel daemon threads. A node not done by the
    deadline is reported as timed out; its thread is abandoned (daemon: it never holds up
    the process's exit, unlike a ThreadPoolExecutor's workers).

    With ``enough`` (asked only once some node is slow, ENOUGH_AFTER_S: a cluster that
    answers promptly never pays for it): once the answers so far are enough (a claim fits), the
    slower nodes get a short grace (half again the time the answers took, at least 0.3 s)
    and are then skipped, so a hanging node does not hold up what does not need it."""
    results: dict[str, Outcome[T]] = {}
    done = threading.Condition()
    start = time.monotonic()
    enough_at: Optional[float] = None

    def worker(node: str) -> None:
        t0 = time.monotonic()
        try:
            outcome: Outcome[T] = Outcome(node, value=call(node), seconds=time.monotonic() - t0)
        except GpuclaimError as exc:
            outcome = Outcome(node, error=exc.message, seconds=time.monotonic() - t0)
        except Exception as exc:  # a node's failure must never take the others down
            outcome = Outcome(
                node, error=f"{type(exc).__name__}: {exc}", seconds=time.monotonic() - t0
            )
        with done:
            results[node] = outcome
            done.notify_all()

    for node in nodes:
        threading.Thread(target=worker, args=(node,), name=f"fanout-{node}", daemon=True).start()
    with done:
        while len(results) < len(nodes):
            now = time.monotonic()
            left = deadline_s - (now - start)
            if enough is not None and enough_at is None:
                if now - start < ENOUGH_AFTER_S:
                    left = min(left, start + ENOUGH_AFTER_S - now)
                elif enough(dict(results)):
                    enough_at = now + max(0.3, 0.5 * (now - start))
            if enough_at is not None:
                left = min(left, enough_at - now)
            if left <= 0:
                break
            done.wait(left)
        final = dict(results)
        skipped = enough_at is not None and time.monotonic() - start < deadline_s
    waited = time.monotonic() - start
    for node in nodes:
        if node not in final:
            error = (
                f"not needed: no answer within {waited:.1f}s"
                if skipped
                else f"no answer within {deadline_s:.0f}s"
            )
            final[node] = Outcome(node, error=error, seconds=waited)
    return final
