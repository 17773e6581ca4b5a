"""The unit tier's guard itself: starting a process fails the test that does it."""

from __future__ import annotations

import subprocess

import pytest

from .conftest import StartedAProcess


def test_starting_a_process_fails_in_the_unit_tier() -> None:
    with pytest.raises(StartedAProcess):
        subprocess.run(["true"], check=False)
