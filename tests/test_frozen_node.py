"""A node that stops answering after a look (a soft lockup, a hung NFS mount: here its sshd
and every process of it stopped with SIGSTOP, their TCP connections open) is judged within
``connect_timeout`` plus a little on every path: the warm agent's greeting through a live
master, a one-shot agent through a live master, a fresh connection. The other nodes' rows
stay intact, and the node is back at the first look after it thaws."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

LIMIT_S = 7.0  # the bound for the default connect_timeout of 5 s


def _timed_status(c: Any) -> tuple[float, int, list[dict[str, Any]], str]:
    started = time.monotonic()
    proc = c.cli("status", "--json", timeout=60)
    took = time.monotonic() - started
    return took, proc.returncode, json.loads(proc.stdout or "[]"), proc.stderr


def _assert_judged(c: Any, frozen: str) -> None:
    took, code, rows, stderr = _timed_status(c)
    assert code == 4, stderr
    assert took <= LIMIT_S, f"status took {took:.1f}s with {frozen} frozen"
    states = {(r["node"], r["index"]): r["state"] for r in rows}
    assert {s for (n, _), s in states.items() if n == frozen} == {"unreachable"}, rows
    others = [s for (n, _), s in states.items() if n != frozen]
    assert others == ["free"] * 8, rows


def _freeze_and_check(tb: Any, c: Any) -> None:
    tb.freeze_node("node02")
    try:
        _assert_judged(c, "node02")  # the first after the freeze: the live master's path
        _assert_judged(c, "node02")  # the next: no dead master trusted again
    finally:
        tb.thaw_node("node02")
    _, code, rows, stderr = _timed_status(c)
    assert code == 0, stderr
    assert {r["state"] for r in rows} == {"free"} and len(rows) == 12


def test_a_frozen_node_is_judged_in_connect_timeout_on_the_warm_path(testbed, make_remote, runtime):
    """Measured before: 20.2 s (the whole deadline) for every status, each time."""
    c = make_remote(testbed, ssh_client="openssh", connect_timeout="5s", deadline="20s")
    # cold, then warm: the agents answer through the masters. Under load the agents the
    # first call installs behind it may come up after the second: look until all three are.
    deadline = time.monotonic() + 30
    sockets: list[Path] = []
    while len(sockets) < 3:
        assert time.monotonic() < deadline, sockets
        _, code, _, stderr = _timed_status(c)
        assert code == 0, stderr
        sockets = list((runtime / "gpuclaim-cm" / "w").glob("w-*.sock"))
    assert len(sockets) == 3
    _freeze_and_check(testbed, c)
    # and warm again after the thaw
    warm = c.cli("--debug", "status", "--json")
    assert warm.returncode == 0 and "through a new SSH session" not in warm.stderr, warm.stderr


def test_a_frozen_node_is_judged_in_connect_timeout_through_a_live_master(
    testbed, make_remote, runtime
):
    """No warm agent: each request is a one-shot agent through the node's live master."""
    c = make_remote(
        testbed, ssh_client="openssh", connect_timeout="5s", deadline="20s", warm_agent=False
    )
    _, code, _, stderr = _timed_status(c)
    assert code == 0, stderr
    masters = [p for p in (runtime / "gpuclaim-cm").iterdir() if p.name != "w"]
    assert len(masters) == 3
    _freeze_and_check(testbed, c)
