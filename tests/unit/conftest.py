"""The fast tier: in-process tests of the engine and core (a temporary store, recorded probe
answers, an injected clock). No sshd, no tmux, no subprocess of gpuclaim: the whole tier runs
in seconds (``pytest tests/unit`` or ``pytest -m unit``). The end-to-end tests stay the proof."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.unit)
