"""The warm agent's reuse of its last GPU read (node/recent_reads.py): a look that allows a
read of some age gets the last one while it is that young, starts a fresh one in the
background once it is half that old, and waits for its own read otherwise."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpuclaim.node import recent_reads
from gpuclaim.node.recent_reads import RecentReads


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(recent_reads.time, "monotonic", c.monotonic)
    return c


class Reader:
    """A probe that counts its reads; ``fail`` makes the next answer an error."""

    def __init__(self) -> None:
        self.reads = 0
        self.fail = False
        self.done = threading.Event()

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.reads += 1
        self.done.set()
        if self.fail:
            return {"error": {"type": "ProbeError", "message": "boom"}}
        return {"result": {"node": request["node"], "read": self.reads}}


def _probe(max_age: float = 1.0, node: str = "n1") -> dict[str, Any]:
    request: dict[str, Any] = {"op": "probe", "node": node, "nvidia_smi": [], "timeout": 10}
    if max_age:
        request["max_age_s"] = max_age
    return request


def _wait_reads(reader: Reader, count: int) -> None:
    deadline = time.time() + 5
    while reader.reads < count:
        assert time.time() < deadline
        time.sleep(0.01)


def test_a_look_that_allows_no_age_always_reads(clock: Clock) -> None:
    reader = Reader()
    reads = RecentReads(reader)
    assert reads.answer(_probe(0))["result"]["read"] == 1
    assert reads.answer(_probe(0))["result"]["read"] == 2


def test_a_young_read_is_reused_and_an_old_one_is_not(clock: Clock) -> None:
    reader = Reader()
    reads = RecentReads(reader)
    assert reads.answer(_probe())["result"]["read"] == 1
    clock.now += 0.3  # younger than half the age allowed: reused, nothing read
    assert reads.answer(_probe())["result"]["read"] == 1
    assert reader.reads == 1
    clock.now += 1.0  # older than allowed: this look waits for its own read
    assert reads.answer(_probe())["result"]["read"] == 2


def test_a_read_half_as_old_as_allowed_is_refreshed_behind_the_answer(clock: Clock) -> None:
    reader = Reader()
    reads = RecentReads(reader)
    reads.answer(_probe())
    clock.now += 0.7
    assert reads.answer(_probe())["result"]["read"] == 1  # answered at once from the last
    _wait_reads(reader, 2)  # and a fresh read made behind it
    deadline = time.time() + 5
    while reads.answer(_probe())["result"]["read"] != 2:
        assert time.time() < deadline
        time.sleep(0.01)
    assert reader.reads == 2  # one refresh, however many looks asked meanwhile


def test_reads_are_kept_per_request_and_errors_are_not_kept(clock: Clock) -> None:
    reader = Reader()
    reads = RecentReads(reader)
    reads.answer(_probe(node="n1"))
    assert reads.answer(_probe(node="n2"))["result"] == {"node": "n2", "read": 2}
    reader.fail = True
    clock.now += 5
    assert "error" in reads.answer(_probe(node="n1"))
    reader.fail = False
    assert reads.answer(_probe(node="n1"))["result"]["read"] == 4  # read again, not the error


def test_a_read_that_found_the_gpus_unreadable_is_not_kept(clock: Clock) -> None:
    """probe_local says a failed GPU read in the inventory (a hung nvidia-smi), not as an
    agent error: the next look reads again all the same."""

    class UnreadableGpus(Reader):
        def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
            answer = super().__call__(request)
            answer["result"]["error"] = "nvidia-smi did not answer within 10s"
            return answer

    reader = UnreadableGpus()
    reads = RecentReads(reader)
    reads.answer(_probe())
    assert reads.answer(_probe())["result"]["read"] == 2
    assert reader.reads == 2


def test_a_slow_reads_age_counts_from_its_answer(clock: Clock) -> None:
    """A node without persistence mode: nvidia-smi takes 2 s, the age allowed is 1 s. Its
    answer is fresh when it comes (the GPUs are read at its end), not 2 s old already."""

    class SlowReader(Reader):
        def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
            clock.now += 2.0
            return super().__call__(request)

    reader = SlowReader()
    reads = RecentReads(reader)
    assert reads.answer(_probe())["result"]["read"] == 1
    clock.now += 0.3
    assert reads.answer(_probe())["result"]["read"] == 1
    assert reader.reads == 1
    clock.now += 1.0  # 1.3 s since its answer: too old, read again
    assert reads.answer(_probe())["result"]["read"] == 2


class GatedReader(Reader):
    """A read that lasts until the test lets it end (nvidia-smi taking seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = threading.Semaphore(0)

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        self.started.release()
        assert self.gate.wait(5)
        return super().__call__(request)


def test_a_look_shares_a_read_in_flight_and_a_decision_does_not(clock: Clock) -> None:
    reader = GatedReader()
    reads = RecentReads(reader)
    answers: dict[str, Any] = {}

    def look(name: str, max_age: float) -> threading.Thread:
        t = threading.Thread(target=lambda: answers.update({name: reads.answer(_probe(max_age))}))
        t.start()
        return t

    first = look("first", 1.0)
    assert reader.started.acquire(timeout=5)  # the first look's read has begun
    clock.now += 0.3
    sharer = look("sharer", 1.0)  # that read begun 0.3 s ago: young enough to wait for
    decision = look("decision", 0)  # a decision reads for itself
    assert reader.started.acquire(timeout=5)
    assert not reader.started.acquire(timeout=0.2)  # two reads, not three
    reader.gate.set()
    for t in (first, sharer, decision):
        t.join(5)
    assert reader.reads == 2
    assert answers["sharer"] is answers["first"]  # the first look's own answer
    assert answers["decision"] is not answers["first"]


def test_a_read_in_flight_too_old_is_not_waited_for(clock: Clock) -> None:
    reader = GatedReader()
    reads = RecentReads(reader)
    first = threading.Thread(target=lambda: reads.answer(_probe(1.0)))
    first.start()
    assert reader.started.acquire(timeout=5)
    clock.now += 1.5  # begun before the age this look allows: it reads for itself
    late = threading.Thread(target=lambda: reads.answer(_probe(1.0)))
    late.start()
    assert reader.started.acquire(timeout=5)
    reader.gate.set()
    first.join(5)
    late.join(5)
    assert reader.reads == 2


class ProcessReader(Reader):
    """A read that shows the given processes: one on a GPU, one as a job's wrapper."""

    def __init__(self, gpu_pid: int, wrapper_pid: int) -> None:
        super().__init__()
        self.gpu_pid, self.wrapper_pid = gpu_pid, wrapper_pid

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        answer = super().__call__(request)
        answer["result"]["gpus"] = [{"index": 0, "processes": [{"pid": self.gpu_pid}]}]
        answer["result"]["liveness"] = {"wrappers": [[self.wrapper_pid, 123]]}
        return answer


@pytest.mark.parametrize("which", ["gpu", "wrapper"])
def test_a_read_showing_a_process_that_ended_since_is_not_reused(
    clock: Clock, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """A job killed just now: the last read still shows its process (or its wrapper) while
    its claim is released already; reused, that read would show its GPUs busy with no
    claim. Once the process has ended, the next look reads again (tests/test_jobs.py kills
    a real job and looks at once)."""
    running = {4242, 4343}

    def kill(pid: int, sig: int) -> None:
        assert sig == 0
        if pid not in running:
            raise ProcessLookupError(pid)

    monkeypatch.setattr(recent_reads.os, "kill", kill)
    reader = ProcessReader(4242, 4343)
    reads = RecentReads(reader)
    assert reads.answer(_probe())["result"]["read"] == 1
    clock.now += 0.2
    assert reads.answer(_probe())["result"]["read"] == 1  # all alive: reused
    running.discard(4242 if which == "gpu" else 4343)
    assert reads.answer(_probe())["result"]["read"] == 2  # one ended: read again
    assert reader.reads == 2


def test_processes_alive_takes_what_it_cannot_check_as_alive() -> None:
    init_and_junk = {"gpus": [{"processes": [{"pid": 1}, {"pid": 0}, {"pid": None}, {}]}]}
    assert recent_reads.processes_alive({"result": init_and_junk})
    assert recent_reads.processes_alive({"error": {"message": "boom"}})
