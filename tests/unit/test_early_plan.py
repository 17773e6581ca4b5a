"""The kept first-contact plan (remote.early_plan): used only for the config file and the
environment it was computed for, merged per node, and never trusted as it is read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuclaim.remote import early_plan


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GPUCLAIM_HOME", str(tmp_path / "home"))
    path = tmp_path / "config.toml"
    path.write_text('nodes = ["a", "b"]\n')
    return str(path)


def _entries(config: str) -> dict[str, early_plan.Entry]:
    return early_plan._read(config)[1]


def test_a_saved_plan_is_read_back_for_the_same_config(config: str) -> None:
    early_plan.save(config, [("a", ["ssh", "--", "a", "look"], ["/x/w-a.sock"], ["/x"])])
    assert _entries(config) == {"a": (["ssh", "--", "a", "look"], ["/x/w-a.sock"], ["/x"])}
    # a call with --node b adds b's, keeps a's
    early_plan.save(config, [("b", ["ssh", "--", "b", "look"], [], [])])
    assert set(_entries(config)) == {"a", "b"}
    early_plan.save(config, [("a", ["ssh", "--", "a", "look2"], [], [])])
    assert _entries(config)["a"] == (["ssh", "--", "a", "look2"], [], [])


def test_an_edited_config_or_another_environment_has_no_plan(
    config: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    early_plan.save(config, [("a", ["ssh", "a"], [], [])])
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/elsewhere")  # the master sockets move
    assert _entries(config) == {}
    monkeypatch.undo()
    monkeypatch.setenv("GPUCLAIM_HOME", str(Path(config).parent / "home"))
    assert set(_entries(config)) == {"a"}
    st = os.stat(config)
    Path(config).write_text('nodes = ["a", "c"]\n')  # the same size: the mtime tells
    os.utime(config, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert _entries(config) == {}
    assert early_plan._read(str(Path(config).parent / "missing.toml")) == (None, {})


def test_a_damaged_plan_file_is_no_plan_and_spawns_nothing(config: str) -> None:
    early_plan.save(config, [("a", ["ssh", "a"], [], [])])
    plan = early_plan._plan_file(config)
    for damage in (plan.read_bytes()[:10], b"", b"\xff" * 64):
        plan.write_bytes(damage)
        assert _entries(config) == {}
        assert early_plan.spawn_predicted(config, None) == 0
    # well-formed, but not a plan's shape: never spawned (the tier fails on any process)
    import marshal

    key = early_plan._key(config)
    shapes = [("ssh a", [], []), ([], [], []), ([1], [], []), (["x"], "g", []), (["x"], [])]
    for nodes in ({"a": shape} for shape in shapes):
        plan.write_bytes(marshal.dumps({"key": key, "nodes": nodes}))
        assert early_plan.spawn_predicted(config, None) == 0


def test_a_node_whose_guard_path_exists_gets_no_predicted_session(
    config: str, tmp_path: Path
) -> None:
    socket = tmp_path / "w-a.sock"
    socket.write_text("")
    early_plan.save(config, [("a", ["ssh", "a"], [str(socket)], [])])
    assert early_plan.spawn_predicted(config, None) == 0  # no process: the tier would fail
    assert early_plan.spawn_predicted(config, ["b"]) == 0  # not a named node


def test_a_socket_directory_that_cannot_be_made_private_spawns_nothing(
    config: str, tmp_path: Path
) -> None:
    link = tmp_path / "cm"
    link.symlink_to(tmp_path)  # a link put where the sockets go: refused, as openssh's is
    early_plan.save(config, [("a", ["ssh", "a"], [], [str(link)])])
    assert early_plan.spawn_predicted(config, None) == 0
    gone = tmp_path / "run" / "gpuclaim-cm"  # after a reboot: made again, 0700
    early_plan.save(config, [("a", ["ssh", "a"], [str(tmp_path / "exists")], [str(gone)])])
    (tmp_path / "exists").write_text("")
    assert early_plan.spawn_predicted(config, None) == 0
    assert not gone.exists()  # a guarded node makes nothing
