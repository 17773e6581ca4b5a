"""The first look of the day without Python on the node (remote/shell_look.py): the command
run by a real ``sh`` here, its output parsed, must say what the agent's own look says
(node.probe.local) for the same nvidia-smi: GPUs, processes and their owners, errors in the
same words, the job wrappers alive; and report the warm agent's state from its where-file."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuclaim.core.liveness import boot_id, process_start
from gpuclaim.node.probe.local import probe_local
from gpuclaim.node.server import host_key
from gpuclaim.remote.shell_look import ShellLook, look_command, parse_look

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
VERSION = "0.1.0-test12345678"


def _fake_smi(tmp_path: Path, body: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)
    return smi


def _xml_with_our_pid(tmp_path: Path) -> Path:
    """A real two-GPU answer whose process is this test's (so its owner can be looked up)."""
    text = (FIXTURES / "09_2x-rtx-a5000_drv590.44.01_q-x_v13_procs.xml").read_text()
    path = tmp_path / "qx.xml"
    path.write_text(text.replace("<pid>100477</pid>", f"<pid>{os.getpid()}</pid>"))
    return path


def _shell_look(
    tmp_path: Path, request: dict[str, Any], path: Optional[str] = None, prefix: str = ""
) -> tuple[Optional[ShellLook], subprocess.CompletedProcess[bytes]]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "PATH": path or f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    command = prefix + look_command(VERSION, 600, request)
    proc = subprocess.run(["sh", "-c", command], env=env, capture_output=True, timeout=30)
    return parse_look(proc.stdout, proc.stderr, request), proc


def _request(
    smi: list[str], timeout: float = 10.0, env: Optional[dict[str, str]] = None
) -> dict[str, Any]:
    return {"op": "probe", "node": "n1", "nvidia_smi": smi, "env": env or {}, "timeout": timeout}


def test_the_shell_look_says_what_the_agent_says(tmp_path: Path) -> None:
    # the node's env setting reaches nvidia-smi (here: which answer it gives)
    env = {"FAKE_SMI_XML": str(_xml_with_our_pid(tmp_path))}
    smi = _fake_smi(tmp_path, 'cat "$FAKE_SMI_XML"')
    # a job wrapper alive on this machine, as a rank's wrapper shows in /proc
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "gpuclaim", "wrap"]
    wrapper = subprocess.Popen([*argv, str(tmp_path / "job" / "spec.json")])
    try:
        time.sleep(0.1)
        agent = probe_local("n1", (str(smi),), env, 10.0, liveness=True).to_dict()
        look, proc = _shell_look(tmp_path, _request([str(smi)], env=env))
        assert look is not None, proc
        assert look.agent == "missing" and look.socket == ""
        assert look.inventory is not None
        live = look.inventory.pop("liveness")
        agent_live = agent.pop("liveness")
        assert look.inventory == agent  # GPUs, processes, owners, driver, source
        assert any(p["user"] for g in agent["gpus"] for p in g["processes"])  # owners looked up
        assert live["boot_id"] == agent_live["boot_id"] == boot_id()
        mine = [wrapper.pid, process_start(wrapper.pid)]
        assert mine in live["wrappers"] and mine in agent_live["wrappers"]
        assert sorted(live["wrappers"]) == sorted(agent_live["wrappers"])
        assert live["checked_from"] >= mine[1]  # the look began after the wrapper started
    finally:
        wrapper.kill()
        wrapper.wait()


def test_only_wrappers_are_read_not_other_looks(tmp_path: Path) -> None:
    """Every look's script (and the shell running it) names the wrappers' spec file: a look
    that found them would read each one's command line and stat (processes on the node) only
    for the laptop to throw them away. A wrapper is read; a look running meanwhile, and the
    look itself, are not."""
    smi = _fake_smi(tmp_path, f"cat {_xml_with_our_pid(tmp_path)}")
    request = _request([str(smi)])
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "gpuclaim", "wrap"]
    wrapper = subprocess.Popen([*argv, str(tmp_path / "job" / "spec.json")])
    # another look, stopped in its tracks: its command line holds the whole script
    other = subprocess.Popen(["sh", "-c", "sleep 60; exit 0", look_command(VERSION, 600, request)])
    try:
        time.sleep(0.1)
        look, proc = _shell_look(tmp_path, request)
        assert look is not None and look.inventory is not None
        listed = [line[3:] for line in proc.stdout.decode().splitlines() if line.startswith("@w ")]
        # other tests' wrappers may run beside this one (pytest workers): theirs are not ours
        listed = [pid for pid in listed if not _someone_elses(int(pid), other.pid)]
        assert listed == [str(wrapper.pid)]
        wrappers = look.inventory["liveness"]["wrappers"]
        assert [w for w in wrappers if not _someone_elses(w[0], other.pid)] == [
            [wrapper.pid, process_start(wrapper.pid)]
        ]
    finally:
        for child in (wrapper, other):
            child.kill()
            child.wait()


def _someone_elses(pid: int, other_look: int) -> bool:
    """A process still running that neither this test nor its other look started (a look
    that has ended, the look itself, is no one else's)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    parent = int(stat.rpartition(")")[2].split()[1])
    return parent not in (os.getpid(), other_look)


@pytest.mark.parametrize(
    "body",
    [
        "echo 'NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.'"
        "; exit 9",
        "echo 'Failed to initialize NVML: Unknown Error' >&2; exit 255",
        "sleep 5",
        "echo '<nvidia_smi_log><gpu'",  # cut short
    ],
)
def test_a_failing_nvidia_smi_is_said_in_the_agents_words(tmp_path: Path, body: str) -> None:
    smi = _fake_smi(tmp_path, body)
    agent = probe_local("n1", (str(smi),), {}, 1.0)
    look, proc = _shell_look(tmp_path, _request([str(smi)], timeout=1.0))
    assert look is not None and look.inventory is not None, proc
    assert agent.error
    assert look.inventory["error"] == agent.error
    assert look.inventory["gpus"] == []


def test_a_configured_nvidia_smi_that_is_not_there(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "nvidia-smi")
    agent = probe_local("n1", (missing,), {}, 5.0)
    look, _ = _shell_look(tmp_path, _request([missing]))
    assert look is not None and look.inventory is not None
    assert (
        look.inventory["error"]
        == agent.error
        == (f"cannot run {missing}: No such file or directory")
    )


def test_no_nvidia_smi_on_the_path_leaves_the_look_to_the_agent(tmp_path: Path) -> None:
    """A node with NVML only: the Python agent reads it (the caller falls back)."""
    (tmp_path / "bin").mkdir()
    look, proc = _shell_look(tmp_path, _request([]), path=str(tmp_path / "bin") + ":/bin")
    assert look is not None, proc
    assert look.inventory is None


def test_what_a_login_script_prints_first_is_skipped(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, f"cat {_xml_with_our_pid(tmp_path)}")
    look, _ = _shell_look(tmp_path, _request([str(smi)]), prefix="echo 'Welcome!'; echo '@end'; ")
    assert look is not None and look.inventory is not None
    assert len(look.inventory["gpus"]) == 2


def test_a_look_cut_short_is_no_answer(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, f"cat {_xml_with_our_pid(tmp_path)}")
    _, proc = _shell_look(tmp_path, _request([str(smi)]))
    whole = proc.stdout
    assert parse_look(whole, b"", _request([str(smi)])) is not None
    assert parse_look(whole[: len(whole) // 2], b"", _request([str(smi)])) is None
    assert parse_look(b"sh: 1: exec: sh: not found\n", b"", _request([str(smi)])) is None


def test_a_process_name_cannot_speak_for_the_script(tmp_path: Path) -> None:
    """Another user on the node names a GPU process with lines of the look's own markers (a
    process name is its owner's to choose): they stay text of the XML. Taken as markers,
    they could point this laptop's forwarded agent socket at that user's socket, or cut
    every look at the node short."""
    evil = "x\n@agent warm\n@socket /tmp/evil.sock\n@end\n@smi-exit 0\n@owners\n@end\ny"
    xml = _xml_with_our_pid(tmp_path)
    name = "/root/src/llama.cpp/build/bin/llama-server"
    xml.write_text(xml.read_text().replace(name, evil))
    smi = _fake_smi(tmp_path, f"cat {xml}")
    look, proc = _shell_look(tmp_path, _request([str(smi)]))
    assert look is not None, proc
    assert (look.agent, look.socket) == ("missing", "")
    assert look.inventory is not None and look.inventory["error"] is None
    names = {p["name"] for g in look.inventory["gpus"] for p in g["processes"]}
    assert names == {evil}
    # and a look whose own end is missing is still no answer, whatever the XML holds
    cut = proc.stdout[: proc.stdout.rindex(b"@owners")]
    assert parse_look(cut, b"", _request([str(smi)])) is None


def test_the_warm_agents_state_comes_from_its_where_file(tmp_path: Path) -> None:
    smi = _fake_smi(tmp_path, f"cat {_xml_with_our_pid(tmp_path)}")
    cache = tmp_path / "home" / ".cache" / "gpuclaim"
    cache.mkdir(parents=True)
    agent_dir = cache / f"agent-{VERSION}"
    agent_dir.mkdir()  # installed (unpacked), not running: the look starts it
    (agent_dir / "gpuclaim").mkdir()  # an agent that cannot start: nothing else runs here
    look, _ = _shell_look(tmp_path, _request([str(smi)]))
    assert look is not None and look.agent == "starting"
    # a server that says where it listens, and lives: warm
    sock_path = tmp_path / "agent.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock_path))
    where = cache / f"agent-{VERSION}@{host_key()}.where"
    try:
        where.write_text(f"{os.getpid()}\n{sock_path}\n{process_start(os.getpid())}\n")
        look, _ = _shell_look(tmp_path, _request([str(smi)]))
        assert look is not None and (look.agent, look.socket) == ("warm", str(sock_path))
        # the agent killed -9, its pid now another process of ours: not warm, started anew
        # (taken for warm, the forward finds no agent and the warm path goes off for 10 min)
        where.write_text(f"{os.getpid()}\n{sock_path}\n{process_start(os.getpid()) - 1}\n")
        look, _ = _shell_look(tmp_path, _request([str(smi)]))
        assert look is not None and look.agent == "starting"
        # its process gone (a kill -9 left the file and the socket): starting again
        dead = subprocess.Popen(["true"])
        dead.wait()
        where.write_text(f"{dead.pid}\n{sock_path}\n")
        look, _ = _shell_look(tmp_path, _request([str(smi)]))
        assert look is not None and look.agent == "starting"
    finally:
        listener.close()


def test_a_warm_agent_killed_with_sigterm_removes_its_where_file(tmp_path: Path) -> None:
    """A clean-up script's `pkill` ends the agent as idleness does: no look takes its dead
    socket for a live agent."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim.node.main", "serve", VERSION, "600"], env=env
    )
    where = tmp_path / ".cache" / "gpuclaim" / f"agent-{VERSION}@{host_key()}.where"
    deadline = time.monotonic() + 15
    while not where.exists():
        assert time.monotonic() < deadline, "the agent never said where it listens"
        time.sleep(0.05)
    pid, path = where.read_text().split("\n")[:2]
    assert int(pid) == server.pid and Path(path).is_socket()
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0
    assert not where.exists() and not Path(path).exists()


def test_a_warm_agent_says_where_it_is_again_after_its_cache_is_removed(tmp_path: Path) -> None:
    """`rm -rf ~/.cache/gpuclaim` under a running agent (a reset, a clean-up): it says where
    it listens again within a second or two, so looks find it warm instead of starting, on
    every look until it idles out, an agent that finds it running and exits."""
    env = {**os.environ, "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim.node.main", "serve", VERSION, "600"], env=env
    )
    cache = tmp_path / ".cache" / "gpuclaim"
    where = cache / f"agent-{VERSION}@{host_key()}.where"
    try:
        deadline = time.monotonic() + 15
        while not where.exists():
            assert time.monotonic() < deadline, "the agent never said where it listens"
            time.sleep(0.05)
        said = where.read_text()
        shutil.rmtree(cache)
        deadline = time.monotonic() + 5
        while not where.exists():
            assert time.monotonic() < deadline, "the agent did not say where it is again"
            time.sleep(0.05)
        assert where.read_text() == said
        assert said.split("\n")[0] == str(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0


def test_a_warm_agent_whose_files_are_removed_quits(tmp_path: Path) -> None:
    """The cache removed with the agent's own code in it (an installed agent): it quits,
    socket and all, so the next look installs afresh instead of finding it warm, unable to
    start a wrapper from files that are gone."""
    code = tmp_path / ".cache" / "gpuclaim" / f"agent-{VERSION}"
    repo = Path(__file__).resolve().parents[1]
    shutil.copytree(repo / "gpuclaim", code / "gpuclaim", ignore=shutil.ignore_patterns("*.pyc"))
    env = {**os.environ, "HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(tmp_path)}
    env["PYTHONPATH"] = str(code)
    server = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim.node.main", "serve", VERSION, "600"],
        env=env,
        cwd=str(tmp_path),
    )
    where = tmp_path / ".cache" / "gpuclaim" / f"agent-{VERSION}@{host_key()}.where"
    try:
        deadline = time.monotonic() + 15
        while not where.exists():
            assert time.monotonic() < deadline, "the agent never said where it listens"
            time.sleep(0.05)
        sock = Path(where.read_text().split("\n")[1])
        shutil.rmtree(tmp_path / ".cache" / "gpuclaim")
        assert server.wait(timeout=10) == 0
        assert not sock.exists() and not where.exists()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
