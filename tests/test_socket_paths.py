"""Every unix socket gpuclaim makes fits in sun_path (107 bytes and a NUL), whatever the home:
the SSH masters (``%C`` and the 17 bytes ssh appends while it creates one), the warm agents'
forwarded sockets on the laptop, the warm agent's socket on the node. Homes of 12 to 120
characters (and non-ASCII ones, longer in bytes than in letters), with and without
``XDG_RUNTIME_DIR``, on the laptop and on the node, through the CLI on the sshd testbed."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import subprocess
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuclaim.node.server import host_key

SUN_PATH_MAX = 107


def dir_of_length(n: int, letter: str = "x") -> Path:
    """A new directory whose path has ``n`` characters (``/tmp/g`` and 6 random hex digits
    at least)."""
    path = f"/tmp/g{secrets.token_hex(3)}"
    if n > len(path):
        path += "-" + letter * (n - len(path) - 1)
    assert len(path) == n or n < 12
    Path(path).mkdir()
    return Path(path)


@pytest.fixture
def made_dirs() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for path in made:
        _close_masters_under(path)
        shutil.rmtree(path, ignore_errors=True)


def _processes() -> Iterator[tuple[int, list[bytes], bytes]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            yield int(entry.name), argv, environ


def _masters(home: Path) -> list[Path]:
    """The sockets of the running SSH masters of a gpuclaim started with ``home`` as HOME:
    ssh titles a master ``ssh: SOCKET [mux]`` (over its environment, so the socket's
    directory tells whose it is: XDG_RUNTIME_DIR's, the home's, or the /tmp one named by
    the home's CRC-32)."""
    fallback = f"gpuclaim-cm-{os.getuid()}-{zlib.crc32(os.fsencode(str(home))):08x}"
    found = []
    for _, argv, _ in _processes():
        title = argv[0].decode(errors="replace")
        if title.startswith("ssh: ") and title.endswith(" [mux]"):
            path = Path(title[len("ssh: ") : -len(" [mux]")])
            ours = [home / ".cache", *XDG_DIRS]
            if path.parent.name == fallback or any(path.parent == d / "gpuclaim-cm" for d in ours):
                found.append(path)
    return found


def _close_masters_under(home: Path) -> None:
    for socket_path in _masters(home):
        _close(socket_path)


def _close(socket_path: Path) -> None:
    subprocess.run(
        ["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "x"],
        capture_output=True,
        timeout=10,
    )


def _assert_private_socket(path: Path) -> None:
    assert len(os.fsencode(str(path))) <= SUN_PATH_MAX, path
    assert stat.S_ISSOCK(path.lstat().st_mode), path
    parent = path.parent.lstat()
    assert parent.st_uid == os.getuid() and stat.S_IMODE(parent.st_mode) == 0o700, path.parent


def _look(c: Any, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return c.cli("--debug", "status", "--json", **env)


def _check_cold_then_warm(c: Any, env: dict[str, str], what: str) -> None:
    home = Path(env["HOME"])
    _close_masters_under(home)
    cold = _look(c, env)
    assert cold.returncode == 0, f"{what}: {cold.stderr}"
    assert len(json.loads(cold.stdout)) == 4 * len(c.nodes), what
    new = _masters(home)
    assert len(new) == len(c.nodes), (what, new)
    for socket_path in new:
        _assert_private_socket(socket_path)
        for forwarded in (socket_path.parent / "w").glob("w-*.sock"):
            _assert_private_socket(forwarded)
    # the first look needs no agent: each is installed behind it, after the command
    deadline = time.monotonic() + 30
    while len(_node_agent_sockets(c.testbed)) < len(c.nodes):
        assert time.monotonic() < deadline, (what, _node_agent_sockets(c.testbed))
        time.sleep(0.05)
    warm = _look(c, env)
    assert warm.returncode == 0, f"{what}: {warm.stderr}"
    # the warm agents answer: their sockets on the node fit, and so do the forwarded ones
    assert "through a new SSH session" not in warm.stderr, f"{what}: {warm.stderr}"
    _close_masters_under(home)


HOMES = [12, 30, 31, 41, 50, 120]
XDG_DIRS: list[Path] = []  # the XDG_RUNTIME_DIRs tests made: masters there are theirs


def test_laptop_homes_of_any_length_with_and_without_xdg_runtime_dir(
    make_testbed, make_remote, made_dirs
):
    """A new user's first ``status`` with a home of 31 characters failed ("unix_listener:
    path ... too long for Unix domain socket") when no XDG_RUNTIME_DIR was set."""
    tb = make_testbed(2, 4)
    c = make_remote(tb, ssh_client="openssh")
    short_xdg = dir_of_length(16)
    long_xdg = dir_of_length(70)
    made_dirs.extend([short_xdg, long_xdg])
    XDG_DIRS.extend([short_xdg, long_xdg])
    for length in [*HOMES, "unicode"]:
        if length == "unicode":
            # fits by letters, not by bytes: ~/.cache/gpuclaim-cm is 47 letters, 62 bytes
            home = dir_of_length(28, letter="ü")
            assert len(os.fsencode(str(home))) + len("/.cache/gpuclaim-cm") > 49
        else:
            home = dir_of_length(int(length))
        made_dirs.append(home)
        for xdg in (None, short_xdg, long_xdg):
            env = {"HOME": str(home)}
            what = f"home of {length} characters, XDG_RUNTIME_DIR={xdg}"
            if xdg is None:
                env["XDG_RUNTIME_DIR"] = ""
            else:
                env["XDG_RUNTIME_DIR"] = str(xdg)
            _check_cold_then_warm(c, env, what)


def test_node_homes_of_any_length_with_and_without_xdg_runtime_dir(
    make_testbed, make_remote, made_dirs
):
    """The warm agent's socket on the node: homes of 12, 80 and 120 characters, one of them
    with a long XDG_RUNTIME_DIR, another with a short one."""
    homes = [dir_of_length(12), dir_of_length(80), dir_of_length(120), dir_of_length(49)]
    xdg_long = dir_of_length(90)
    xdg_short = dir_of_length(20)
    made_dirs.extend([*homes, xdg_long, xdg_short])
    node_env = {
        "node01": {"HOME": str(homes[0])},
        "node02": {"HOME": str(homes[1]), "XDG_RUNTIME_DIR": str(xdg_long)},
        "node03": {"HOME": str(homes[2])},
        "node04": {"HOME": str(homes[3]), "XDG_RUNTIME_DIR": str(xdg_short)},
    }
    tb = make_testbed(4, 4, node_env=node_env)
    c = make_remote(tb, ssh_client="openssh")
    laptop_home = dir_of_length(40)
    made_dirs.append(laptop_home)
    _check_cold_then_warm(c, {"HOME": str(laptop_home), "XDG_RUNTIME_DIR": ""}, "nodes")
    # each node's agent socket: in the short XDG dir when given, else under /tmp or home
    sockets = _node_agent_sockets(tb)
    assert set(sockets) == set(node_env), sockets
    for path in sockets.values():
        _assert_private_socket(path)
    assert str(sockets["node04"]).startswith(str(xdg_short) + "/gpuclaim/")
    assert str(sockets["node01"]).startswith(str(homes[0]) + f"/.cache/gpuclaim/run-{host_key()}/")
    assert str(sockets["node03"]).startswith("/tmp/gpuclaim-run-")


def _node_agent_sockets(tb: Any) -> dict[str, Path]:
    """Each node's warm agent socket, from the sockets its agent process listens on."""
    inodes: dict[int, str] = {}
    for pid, argv, environ in _processes():
        node = _env_value(environ, "GPUCLAIM_NODE")
        if node is None or _env_value(environ, "GPUCLAIM_TESTBED") != str(tb.dir):
            continue
        if not any(a in (b"serve", b"serve-and") for a in argv):
            continue
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes[int(target[8:-1])] = node
    found = {}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and int(fields[6]) in inodes and fields[7].endswith(".sock"):
            found[inodes[int(fields[6])]] = Path(fields[7])
    return found


def _env_value(environ: bytes, name: str) -> Optional[str]:
    for item in environ.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key == name.encode():
            return value.decode(errors="replace")
    return None


def test_a_fallback_directory_made_a_link_is_refused(make_testbed, make_remote, made_dirs):
    """The short directory in /tmp is per user and home; a link put there in its place (as
    anyone can in /tmp) is not followed: one line, exit 4, nothing traced back."""
    tb = make_testbed(1, 1)
    c = make_remote(tb, ssh_client="openssh")
    home = dir_of_length(90)
    made_dirs.append(home)
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": ""}
    first = c.cli("status", "--json", **env)
    assert first.returncode == 0, first.stderr
    (socket_path,) = _masters(home)
    fallback = socket_path.parent
    assert fallback.name.startswith(f"gpuclaim-cm-{os.getuid()}-"), fallback
    _close_masters_under(home)
    shutil.rmtree(fallback)
    fallback.symlink_to(home)  # as another user could in /tmp
    try:
        proc = c.cli("status", "--json", **env)
        assert proc.returncode == 4, proc.stderr
        (row,) = json.loads(proc.stdout)
        assert row["state"] == "unreachable"
        assert f"{fallback} is not a directory: not using it for ssh sockets" in json.dumps(row)
        assert "Traceback" not in proc.stderr
    finally:
        fallback.unlink()


def test_a_long_version_keeps_the_agent_socket_name_in_its_budget(monkeypatch, tmp_path):
    """The node's directory is chosen for a 40-byte name; a longer local version (a dev
    build's) is shortened to fit, distinct per version."""
    from gpuclaim.node import server

    home = tmp_path / "h"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    plain = server.socket_path("0.1.0-0123456789ab")
    assert plain.name == "agent-0.1.0-0123456789ab.sock"
    names = {
        server.socket_path(f"0.1.0.dev{n}+g0123456.d20261203-0123456789ab").name for n in (1, 2)
    }
    assert len(names) == 2
    for name in names:
        assert len(name.encode()) <= 40 and name.startswith("agent-") and name.endswith(".sock")


def test_socket_dir_counts_bytes_and_falls_back_to_a_private_tmp_dir(monkeypatch, made_dirs):
    from gpuclaim.core.paths import SUN_PATH_MAX, socket_dir

    for length in (12, 49, 50, 120):
        home = dir_of_length(length)
        made_dirs.append(home)
        monkeypatch.setenv("HOME", str(home))
        chosen = socket_dir([home / ".cache" / "x"], 57, "t", "test sockets")
        assert len(os.fsencode(str(chosen))) + 1 + 57 <= SUN_PATH_MAX
        assert (chosen.parent == home / ".cache") == (length <= 49 - len("/.cache/x"))
        assert stat.S_IMODE(chosen.lstat().st_mode) == 0o700
        if chosen.parent != home / ".cache":
            shutil.rmtree(chosen)
