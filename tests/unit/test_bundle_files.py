"""The agent's files kept in the data dir (remote/bundle.py) are asked for by every node's
look at once, from the fan-out's threads: each must get the whole file, none an error (a
lost race here left a node without its agent until the next command)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuclaim.remote import bundle

pytestmark = pytest.mark.unit


def test_every_thread_gets_the_install_input_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUCLAIM_HOME", str(tmp_path))
    bundle.agent_bundle.cache_clear()
    got: list[Path] = []
    failed: list[BaseException] = []
    start = threading.Barrier(16)

    def ask() -> None:
        start.wait()
        try:
            got.append(bundle.install_input(b'{"op": "ping"}'))
        except BaseException as exc:  # what the test reports
            failed.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    assert len(set(got)) == 1 and len(got) == 16
    made = got[0].read_bytes()
    assert made.startswith(b'{"op": "ping"}\n') and len(made) > 10_000
    assert sorted(p.name for p in got[0].parent.iterdir() if p.name.startswith(".")) == []
    bundle.agent_bundle.cache_clear()


def test_a_look_that_finds_no_agent_builds_its_bundle_after_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new version's first look queues the install: the bundle (~0.3 s to build) is made
    when the installs start (at exit, after the answer was printed), not in the look."""
    from gpuclaim.remote import warm

    monkeypatch.setenv("GPUCLAIM_HOME", str(tmp_path / "home"))
    bundle.agent_bundle.cache_clear()
    monkeypatch.setattr(bundle, "_INSTALL_INPUTS", {})  # no other test's file
    monkeypatch.setattr(warm, "_PENDING", {})
    monkeypatch.setattr(warm, "_INSTALLING", {})
    monkeypatch.setattr(warm.atexit, "register", lambda f: None)
    monkeypatch.setattr(warm, "INSTALL_AFTER_S", 3600.0)  # its timer never fires in the test
    started: list[tuple[list[str], Path, bytes]] = []

    class Pool:
        control_dir = tmp_path / "cm"
        ssh_config_path = None

        def start_detached(self, aliases: list[str], command: str, stdin: Path) -> object:
            started.append((aliases, stdin, stdin.read_bytes()[:40]))
            return object()

    agents = warm.WarmAgents(Pool(), "0.1.0-abc", 600.0, lambda *a: {})  # type: ignore[arg-type]
    agents._install_in_background("node01")
    agents._install_in_background("node02")
    assert not list((tmp_path / "home").glob("bundles/*"))  # nothing built by the looks
    warm._start_installs()
    ((aliases, stdin, head),) = started  # one spawn for both nodes
    assert aliases == ["node01", "node02"] and head.startswith(b'{"op": "ping"}\n')
    assert stdin.parent == tmp_path / "home" / "bundles" and warm._PENDING == {}
    bundle.agent_bundle.cache_clear()
