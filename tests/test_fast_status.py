"""``status`` answered without typer (entry.fast) says what the typer app says: the same
rows, tables, messages and exit codes; what is outside its few options (help, typos, other
options) is the typer app's, errors and all."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import pytest

pytestmark = pytest.mark.cli

# The same command through the typer app: the typer-free start switched off
THROUGH_TYPER = (
    "import sys\n"
    "import gpuclaim.entry.fast as fast\n"
    "fast.fast_command = lambda args: None\n"
    "from gpuclaim.entry.main import main\n"
    "sys.exit(main())\n"
)


def _through_typer(cluster: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.python(THROUGH_TYPER, *args)  # type: ignore[no-any-return]


def _said(proc: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    """What a call said, less what moves with the clock between two calls (how long a claim
    has been idle, how long it has left)."""
    return proc.returncode, _steady(proc.stdout), proc.stderr


def _steady(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return re.sub(r"\b\d+[smhd]\b", "<time>", text)  # the table's LEFT and idle notes
    return json.dumps(_without_clock(data), indent=2)


def _without_clock(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_clock(v) for k, v in data.items() if k != "idle_for_s"}
    if isinstance(data, list):
        return [_without_clock(v) for v in data]
    return data


def test_a_look_says_the_same_without_typer(make_cluster: Any) -> None:
    c = make_cluster({"node01": 2, "node02": 2})
    c.json("claim", "--gpu", "node01:1")
    for args in (
        ("status", "--json"),
        ("ls", "--json", "--node", "node01"),
        ("status", "--node=node02"),
        ("status",),
        ("status", "-q"),
        ("--debug", "--config", str(c.config_path), "status", "--json", "--quiet"),
        ("status", "--node", "nosuch"),  # an error: one line, the same code
    ):
        assert _said(c.cli(*args)) == _said(_through_typer(c, *args)), args
    rows = json.loads(c.cli("status", "--json").stdout)
    assert [r["state"] for r in rows] == ["free", "claimed", "free", "free"]
    unknown = c.cli("status", "--node", "nosuch")
    assert unknown.returncode == 1 and "unknown node 'nosuch'" in unknown.stderr


def test_an_unreachable_node_is_exit_4_either_way(make_cluster: Any) -> None:
    c = make_cluster({"node01": 2, "node02": 2})
    state = json.loads(c.state_path.read_text())
    state["nodes"]["node02"]["fail"] = True
    c.state_path.write_text(json.dumps(state))
    fast, slow = c.cli("status", "--json"), _through_typer(c, "status", "--json")
    assert fast.returncode == slow.returncode == 4
    assert fast.stdout == slow.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("status", "--jsno"), "No such option: --jsno"),
        (("status", "--node"), "Option '--node' requires an argument"),
        (("status", "extra"), "Got unexpected extra argument(s) (extra)"),
    ],
)
def test_what_it_does_not_take_is_the_typer_apps_to_refuse(
    cluster: Any, args: tuple[str, ...], said: str
) -> None:
    proc = cluster.cli(*args)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr
    assert _said(proc) == _said(_through_typer(cluster, *args))


def test_help_and_version_are_the_typer_apps(cluster: Any) -> None:
    helped = cluster.cli("status", "--help")
    assert helped.returncode == 0 and "--json" in helped.stdout and "--node" in helped.stdout
    assert cluster.cli("--version", "status").stdout.startswith("gpuclaim ")
