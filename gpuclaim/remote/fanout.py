"""Ask many nodes at once, with one overall deadline: every node gets a result or an error."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Generic, Optional, TypeVar

from gpuclaim.errors import GpuclaimError

T = TypeVar("T")


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
    nodes: Sequence[str], call: Callable[[str], T], deadline_s: float
) -> dict[str, Outcome[T]]:
    """Run ``call(node)`` for all nodes in parallel daemon threads. A node not done by the
    deadline is reported as timed out; its thread is abandoned (daemon: it never holds up
    the process's exit, unlike a ThreadPoolExecutor's workers)."""
    results: dict[str, Outcome[T]] = {}
    done = threading.Condition()
    start = time.monotonic()

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
            left = deadline_s - (time.monotonic() - start)
            if left <= 0:
                break
            done.wait(left)
        final = dict(results)
    for node in nodes:
        if node not in final:
            final[node] = Outcome(
                node, error=f"no answer within {deadline_s:.0f}s", seconds=deadline_s
            )
    return final
