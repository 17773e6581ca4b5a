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
