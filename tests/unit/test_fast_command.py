"""Which arguments the typer-free start takes (entry.fast): only what the typer app would
read the same way; the rest is left to it."""

from __future__ import annotations

import pytest

from gpuclaim.entry.fast import fast_command, leading_globals

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["ls"],
        ["status", "--json"],
        ["status", "-q"],
        ["status", "--quiet", "--json"],
        ["status", "--node", "node01", "--node=node[02-03]", "--json"],
        ["--config", "c.toml", "status", "--json"],
        ["--config=c.toml", "--debug", "ls"],
    ],
)
def test_taken(args: list[str]) -> None:
    assert fast_command(args) is not None


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["claim"],
        ["status", "--help"],
        ["status", "-h"],
        ["status", "--node"],
        ["status", "--node", "--json"],  # click would take --json as the node's name
        ["status", "--node="],
        ["status", "-qj"],
        ["status", "node01"],
        ["status", "--", "--json"],
        ["--config", "status"],
        ["--config"],
        ["--version", "status"],
        ["status", "--json", "--config", "c.toml"],  # a global option after the command
    ],
)
def test_left_to_the_typer_app(args: list[str]) -> None:
    assert fast_command(args) is None


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "--", "x"], (None, 0)),
        (["--config", "c.toml", "claim", "-n", "2"], ("c.toml", 2)),
        (["--debug", "--config=c.toml", "board"], ("c.toml", 2)),
        (["--debug"], (None, 1)),  # no command: where it would be is past the end
        (["--config"], None),
        (["--config", "--debug", "status"], None),  # click takes --debug as the path
        (["--version", "status"], None),
        (["--config=", "status"], None),
    ],
)
def test_leading_globals(args: list[str], expected: object) -> None:
    """The globals before the command, read once for both the typer-free start and the
    first call's early SSH sessions (entry.main._first_contacts)."""
    assert leading_globals(args) == expected
