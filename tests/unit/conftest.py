"""The fast tier: in-process tests of the engine and core (a temporary store, recorded probe
answers, an injected clock). No sshd, no tmux, no subprocess of gpuclaim: the whole tier runs
in seconds (``pytest tests/unit`` or ``pytest -m unit``). The end-to-end tests stay the proof."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.unit)


class StartedAProcess(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_process_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tier's promise, held: a unit test that starts any process (sshd, tmux, ssh, a
    gpuclaim, nvidia-smi) fails, instead of quietly making the tier slow or machine-bound."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise StartedAProcess(f"the unit tier starts no process: {args[1:2]}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
