"""The warm agent (node/server.py, remote/warm.py) on the sshd testbed: looks go through the
SSH master to an agent that stays up; every way that fails falls back, only slower; the
safety rules hold (own user only, stale sockets, a new version, a master killed, idle exit)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from testbed_fixtures import looks_until_warm

from gpuclaim.node.server import host_key

ROOT = Path(__file__).resolve().parents[1]


def _agents(testbed: Any) -> list[tuple[int, str]]:
    """(pid, argv) of every warm agent running on this machine for the testbed's nodes
    (``None``: every warm agent)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        mine = testbed is None or any(a.startswith(str(testbed.dir).encode()) for a in argv)
        # forked from serve-and, or started by a shell look (serve-detached)
        serving = any(a in (b"serve", b"serve-and", b"serve-detached") for a in argv)
        if mine and serving and any(b"gpuclaim" in a for a in argv):
            found.append((int(entry.name), " ".join(a.decode() for a in argv)))
    return found


def _wait_for_agents(testbed: Any, count: int, timeout: float = 20.0) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    while len(_agents(testbed)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} agents: {_agents(testbed)}"
        time.sleep(0.05)
    return _agents(testbed)


def test_status_goes_through_the_warm_agent_and_is_the_same(testbed, make_remote, runtime):
    c = make_remote(testbed, ssh_client="openssh")
    cold = c.cli("--debug", "status", "--json")
    assert cold.returncode == 0, cold.stderr
    assert len(json.loads(cold.stdout)) == 12
    for node in ("node01", "node02", "node03"):  # no Python started for the first look
        assert f"{node}: looked with sh (warm agent: missing)" in cold.stderr
    _wait_for_agents(testbed, 3)  # installed behind it, after the command
    looks_until_warm(c, runtime, 3)
    agents = _agents(testbed)
    assert len(agents) == 3, agents
    warm = c.json("status")
    assert [(r["node"], r["uuid"], r["state"]) for r in warm] == [
        (r["node"], r["uuid"], r["state"]) for r in json.loads(cold.stdout)
    ]
    assert _agents(testbed) == agents  # the same agents answered: nothing was started
    # claims, runs and the board's refresh use it too
    c.ok("claim", "--gpu", "node02:1")
    rows = c.json("status")
    assert [(r["node"], r["index"]) for r in rows if r["claim"]] == [("node02", 1)]
    # a job starts through it too, and gets what a job started over SSH gets: the login
    # environment, the SSH session's variables
    shown = 'echo "hi $CUDA_VISIBLE_DEVICES ${SSH_CONNECTION:+ssh}"'
    proc = c.cli("--debug", "run", "--follow", "--name", "warm", "--", "sh", "-c", shown)
    assert proc.returncode == 0, proc.stderr
    assert "through a new SSH session" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines() == ["hi 0 ssh"], proc.stdout
    # the warm agent waits for what it starts detached: a queue keeper or a spare-tree
    # builder that ended is no zombie of a process that lives on
    c.ok("claim", "--node", "node03", "-n", "4", "--time", "3s")
    c.ok("run", "--node", "node03", "--queue", "--name", "queued", "--", "true")  # a keeper
    _wait_for_state(c, "queued", "succeeded")
    _wait_until_none_runs(testbed, b"keep-queue")  # it exits once nothing waits (2 s polls)
    assert _agents(testbed) == agents
    assert _zombies_of([pid for pid, _ in agents]) == []


def _wait_for_state(c: Any, name: str, state: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(j["name"] == name and j["state"] == state for j in c.json("jobs", "--all")):
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} never {state}: {c.json('jobs', '--all')}")


def _wait_until_none_runs(testbed: Any, word: bytes, timeout: float = 15.0) -> None:
    """Until no process of the testbed's nodes has ``word`` among its arguments."""
    mine = str(testbed.dir).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = []
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if word in argv and any(a.startswith(mine) for a in argv):
                running.append(entry.name)
        if not running:
            return
        time.sleep(0.2)
    raise AssertionError(f"{word!r} still runs after {timeout}s")


def _zombies_of(parents: list[int]) -> list[int]:
    """The zombie children of ``parents``, waited for a moment (a reaper thread's turn)."""
    deadline = time.monotonic() + 2.0
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if fields[0] == "Z" and int(fields[1]) in parents:
                found.append(int(entry.name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _ssh_clients_running(home: Path, word: bytes) -> list[str]:
    """The ssh clients of a gpuclaim started with ``home`` as GPUCLAIM_HOME whose command
    line holds ``word``."""
    mark = f"GPUCLAIM_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environ and argv[0].endswith(b"ssh") and any(word in a for a in argv):
            found.append(entry.name)
    return found


def _early_sessions_running(home: Path) -> list[str]:
    """The ssh clients of a first contact (their command asks for the agent) of a gpuclaim
    started with ``home`` as GPUCLAIM_HOME (other tests run beside this one)."""
    return _ssh_clients_running(home, b"@gpuclaim-look")


def test_a_first_call_opens_its_ssh_sessions_before_the_command_runs(testbed, make_remote, runtime):
    """The first look of the day starts each node's first-contact session while the CLI
    still starts (remote.early), and the fan-out uses those same sessions: no second
    connection. Warm nodes get none; sessions a failing command never used are closed."""
    c = make_remote(testbed, ssh_client="openssh")
    first = c.cli("--debug", "status", "--json")
    assert first.returncode == 0, first.stderr
    assert len(json.loads(first.stdout)) == 12
    for node in ("node01", "node02", "node03"):
        assert f"{node}: first contact started before the command" in first.stderr
        assert f"{node}: the early first contact answers this request" in first.stderr
    assert "was not needed" not in first.stderr
    masters = [p for p in (runtime / "gpuclaim-cm").iterdir() if p.name != "w"]
    assert len(masters) == 3  # one connection per node, as without the head start
    looks_until_warm(c, runtime, 3)
    warm = c.cli("--debug", "status", "--json")
    assert warm.returncode == 0 and "first contact" not in warm.stderr, warm.stderr
    # --node: only that node gets one (the others' warm sockets gone: they would too)
    for forwarded in (runtime / "gpuclaim-cm" / "w").glob("w-*.sock"):
        forwarded.unlink()
    one = c.cli("--debug", "claim", "--node", "node02", "-n", "1", "--json")
    assert one.returncode == 0, one.stderr
    assert "node02: first contact started" in one.stderr
    assert "node01: first contact" not in one.stderr and "node03: first" not in one.stderr
    # a command that fails before it looks: what it started is closed, nothing is left
    bad = c.cli("--debug", "claim", "-n", "1", "--time", "soon")
    assert bad.returncode == 2, bad.stderr
    assert "node01: first contact started before the command" in bad.stderr
    assert "an early first contact was not needed: closed" in bad.stderr
    assert _early_sessions_running(c.home) == []
    # and the nodes are as reachable as before
    assert {r["state"] for r in c.json("status") if r["node"] != "node02"} == {"free"}


def test_a_first_call_spawns_the_last_calls_sessions_and_never_uses_a_wrong_one(
    testbed, make_remote, runtime
):
    """The next first call with the same config spawns the sessions the last one computed
    before reading the config (remote.early_plan) and adopts them; a kept plan whose
    command is not the one needed now (another version, a tampered file) is killed unused,
    and a broken plan file is only a lost head start."""
    c = make_remote(testbed, ssh_client="openssh")
    first = c.cli("--debug", "status", "--json")
    assert first.returncode == 0, first.stderr
    assert "from the last call's plan" not in first.stderr  # nothing kept yet
    plans = list((c.home / "early").glob("plan-*"))
    assert len(plans) == 1
    looks_until_warm(c, runtime, 3)

    def cold() -> None:  # as on the next morning: no forwarded socket, no master
        for forwarded in (runtime / "gpuclaim-cm" / "w").glob("w-*.sock"):
            forwarded.unlink()

    # after a reboot: no master, no socket directory at all (it is made again first)
    for master in (runtime / "gpuclaim-cm").iterdir():
        if master.name != "w":
            subprocess.run(["ssh", "-o", f"ControlPath={master}", "-O", "exit", "x"], check=False)
    shutil.rmtree(runtime / "gpuclaim-cm")
    again = c.cli("--debug", "status", "--json")
    assert again.returncode == 0, again.stderr
    assert len(json.loads(again.stdout)) == 12
    for node in ("node01", "node02", "node03"):
        assert f"{node}: first contact spawned from the last call's plan" in again.stderr
        assert f"{node}: the early first contact answers this request" in again.stderr
    assert "was not needed" not in again.stderr
    # a plan whose node01 command is another one: spawned, never adopted, killed
    import marshal

    kept = marshal.loads(plans[0].read_bytes())
    argv, guards, folders = kept["nodes"]["node01"]
    kept["nodes"]["node01"] = ([*argv[:-1], "echo not-the-look; sleep 60"], guards, folders)
    plans[0].write_bytes(marshal.dumps(kept))
    looks_until_warm(c, runtime, 3)
    cold()
    wrong = c.cli("--debug", "status", "--json")
    assert wrong.returncode == 0, wrong.stderr
    assert {r["state"] for r in json.loads(wrong.stdout)} == {"free"}
    assert "node01: first contact spawned from the last call's plan" not in wrong.stderr
    assert "node02: first contact spawned from the last call's plan" in wrong.stderr
    assert "node01: first contact started before the command" in wrong.stderr
    assert _ssh_clients_running(c.home, b"not-the-look") == []
    # the plan is the right one again; a torn plan file is no plan
    assert "not-the-look" not in plans[0].read_bytes().decode("utf-8", "replace")
    plans[0].write_bytes(plans[0].read_bytes()[:40])
    looks_until_warm(c, runtime, 3)
    cold()
    torn = c.cli("--debug", "status", "--json")
    assert torn.returncode == 0, torn.stderr
    assert "from the last call's plan" not in torn.stderr
    assert "node01: first contact started before the command" in torn.stderr


def test_a_killed_master_and_a_stale_socket_are_replaced(testbed, make_remote, runtime):
    c = make_remote(testbed, nodes=["node01"], ssh_client="openssh")
    looks_until_warm(c, runtime, 1)
    masters = [p for p in (runtime / "gpuclaim-cm").iterdir() if p.name != "w"]
    assert len(masters) == 1
    subprocess.run(["ssh", "-o", f"ControlPath={masters[0]}", "-O", "exit", "x"], check=False)
    (forwarded,) = (runtime / "gpuclaim-cm" / "w").glob("w-*.sock")
    assert forwarded.exists()  # left behind by the dead master: nobody listens
    rows = c.json("status")
    assert {r["state"] for r in rows} == {"free"}
    assert _connects(forwarded)  # a new master forwards it again


def test_an_agent_gone_while_its_master_lives_comes_back_warm(testbed, make_remote, runtime):
    """The warm agent exits (idle, killed) but the master still holds the forwarding: the
    next look restarts it and forwards again, and the node does not drop to the slow path."""
    c = make_remote(testbed, nodes=["node01"], ssh_client="openssh")
    looks_until_warm(c, runtime, 1)
    (before,) = _agents(testbed)
    os.kill(before[0], 9)
    _wait_gone(before[0])
    for _ in range(3):  # the first of these restarts it; none may turn the warm path off
        assert {r["state"] for r in c.json("status")} == {"free"}
    assert not list((runtime / "gpuclaim-cm" / "w").glob("w-*.off"))
    (after,) = _wait_for_agents(testbed, 1)
    assert after[0] != before[0]
    (forwarded,) = (runtime / "gpuclaim-cm" / "w").glob("w-*.sock")
    assert _connects(forwarded)
    assert c.json("doctor", "--json")[0]["path"].startswith("warm agent")


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"process {pid} did not exit"
        time.sleep(0.05)


def test_no_forwarding_allowed_falls_back_to_the_one_shot_agent(testbed, make_remote, runtime):
    c = make_remote(testbed, nodes=["node01"], ssh_client="openssh")
    sshd_config = testbed.node_dir("node01") / "sshd_config"
    original = sshd_config.read_text()
    testbed.stop_node("node01")
    sshd_config.write_text(original + "AllowStreamLocalForwarding no\n")
    testbed.start_node("node01")
    try:
        # the first look installs the agent (sh looks, then forwarding is tried and refused)
        deadline = time.monotonic() + 30
        while not list((runtime / "gpuclaim-cm" / "w").glob("w-*.off")):
            assert time.monotonic() < deadline, "forwarding was never found refused"
            rows = c.json("status")
            assert {r["state"] for r in rows} == {"free"}
        for _ in range(2):  # and the looks go on, by sh
            assert {r["state"] for r in c.json("status")} == {"free"}
        (off,) = (runtime / "gpuclaim-cm" / "w").glob("w-*.off")
        assert "refuses to forward" in off.read_text()
        report = c.json("doctor", "--json")
        assert report[0]["path"].startswith("one-shot agent"), report
        assert "AllowStreamLocalForwarding" in report[0]["path"]
    finally:
        testbed.stop_node("node01")
        sshd_config.write_text(original)
        testbed.start_node("node01")


def test_the_agent_answers_only_its_own_user(tmp_path: Path) -> None:
    from gpuclaim.node import server

    env = dict(os.environ, HOME=str(tmp_path), XDG_RUNTIME_DIR="")
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from gpuclaim.node import server\n"
        "print(server.socket_path('t-1'), flush=True)\n"
        "server.Server('t-1', 30).run()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        path = Path(proc.stdout.readline().decode().strip())
        _wait_for(path)
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
        assert server.ask(path, {"op": "ping"})["result"]["version"]
        # another user is refused twice: by the 0700 directory, and, were the socket
        # reachable, by the peer's uid (the server closes without a greeting)
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        hello = (
            "import socket; s=socket.socket(socket.AF_UNIX); "
            f"s.connect({str(path)!r}); print(repr(s.recv(100)))"
        )
        blocked = subprocess.run(
            [*as_nobody, sys.executable, "-c", hello], capture_output=True, text=True
        )
        assert blocked.returncode != 0 and "Permission denied" in blocked.stderr
        path.parent.chmod(0o755)
        path.chmod(0o666)
        dropped = subprocess.run(
            [*as_nobody, sys.executable, "-c", hello], capture_output=True, text=True
        )
        assert dropped.stdout.strip() == "b''", (dropped.stdout, dropped.stderr)
        assert server.ask(path, {"op": "ping"})["result"]["version"]  # we still are
    finally:
        proc.terminate()
        proc.wait(10)
        if "path" in locals() and path.parent.name.startswith("gpuclaim-"):
            shutil.rmtree(path.parent, ignore_errors=True)


def test_a_new_version_retires_an_idle_other_spares_one_in_use_and_idle_agents_exit(
    tmp_path: Path,
) -> None:
    from gpuclaim.node import server

    env = dict(os.environ, HOME=str(tmp_path), XDG_RUNTIME_DIR="")
    entry = [sys.executable, "-m", "gpuclaim.node.main"]
    env["PYTHONPATH"] = str(ROOT)

    def ensure(version: str, idle: str) -> dict[str, Any]:
        out = subprocess.run(
            [*entry, "serve-ensure", version, idle], env=env, capture_output=True, text=True
        )
        return json.loads(out.stdout)["result"]

    old = ensure("v-old", "60")
    assert old["started"] and ensure("v-old", "60")["started"] is False  # found, not doubled
    # in use (asked a moment ago: a laptop of that version looks in turns): left to run
    busy = ensure("v-busy", "60")
    assert server.ask(Path(busy["socket"]), {"op": "ping"})["result"]
    time.sleep(1.6)  # old idle for longer than the new one's idle limit; busy asked again
    assert server.ask(Path(busy["socket"]), {"op": "ping"})["result"]
    new = ensure("v-new", "1.5")
    deadline = time.monotonic() + 10
    while Path(old["socket"]).exists():  # idle: told to quit by the newer one
        assert time.monotonic() < deadline, "the old agent did not retire"
        time.sleep(0.1)
    assert server.ask(Path(busy["socket"]), {"op": "ping"})["result"]  # still serving
    server.ask(Path(busy["socket"]), {"op": "quit"})
    deadline = time.monotonic() + 10
    while Path(new["socket"]).exists():  # idle for 1.5 s: gone, socket removed
        assert time.monotonic() < deadline, "the idle agent did not exit"
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while [p for p, argv in _agents(None) if str(tmp_path) in argv or "v-new" in argv]:
        assert time.monotonic() < deadline, "an agent's process outlived its socket"
        time.sleep(0.05)


def _connects(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, f"no socket {path}"
        time.sleep(0.05)


@pytest.mark.parametrize("client", ["openssh", "fabric"])
def test_a_node_with_a_driver_is_read_through_nvml_in_the_agent(
    make_testbed, make_remote, runtime, client
):
    """Nodes whose Python finds pynvml (here the simulator's NVML face) are probed in-process,
    kept warm behind the master, and show the same GPUs and jobs as nvidia-smi would."""
    tb = make_testbed(2, 2, nvml=True)
    c = make_remote(tb, ssh_client=client)
    report = c.json("doctor", "--json")
    assert [(r["node"], r["gpu_source"]) for r in report] == [
        ("node01", "nvml"),
        ("node02", "nvml"),
    ]
    proc = c.cli("run", "--node", "node02", "--name", "nv", "--", "sleep", "30")
    assert proc.returncode == 0, proc.stderr
    deadline = time.monotonic() + 15
    while True:
        rows = c.json("status")
        busy = [(r["node"], r["index"], [p["name"] for p in r["processes"]]) for r in rows]
        if ("node02", 0, ["sleep"]) in busy or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert busy == [
        ("node01", 0, []),
        ("node01", 1, []),
        ("node02", 0, ["sleep"]),
        ("node02", 1, []),
    ]
    c.ok("kill", "nv")


def test_a_fan_out_opens_the_ssh_side_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every thread of a fan-out asks for the agent client at once; only one may build it
    (16 threads building their own cost 0.7 s of CPU at 16 nodes)."""
    import threading

    from gpuclaim.core.config import Config
    from gpuclaim.remote import channels, session

    opened = []

    def open_agent(config: Config) -> object:
        opened.append(threading.current_thread().name)
        time.sleep(0.05)  # long enough for every other thread to arrive meanwhile
        return object()

    monkeypatch.setattr(session, "open_agent", open_agent)
    node_channels = channels.NodeChannels(Config(None, "t", (), "/nonexistent"))
    got: list[object] = []
    threads = [threading.Thread(target=lambda: got.append(node_channels.agent)) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 1 and len(got) == 16 and len({id(a) for a in got}) == 1


def test_the_agent_a_first_call_forked_exits_when_idle_and_leaves_nothing(
    testbed, make_remote, runtime
):
    """serve-and forks the one-shot agent into the warm one: that one, too, exits after
    agent_idle without a request, removes its socket and leaves no process behind."""
    c = make_remote(testbed, nodes=["node01"], ssh_client="openssh", agent_idle="2s")
    c.json("status")  # sh looks; the agent is installed behind it and forks into the warm one
    run_dir = testbed.node_dir("node01") / "home" / ".cache" / "gpuclaim" / f"run-{host_key()}"
    deadline = time.monotonic() + 20
    while not list(run_dir.glob("agent-*.sock")):
        assert time.monotonic() < deadline, "the agent never made its socket"
        time.sleep(0.02)
    time.sleep(0.2)  # the installing process exits once it has forked
    ((pid, argv),) = _wait_for_agents(testbed, 1)
    assert "serve-and" in argv  # the forked one, not one started by serve-ensure
    _wait_gone(pid)  # 2 s idle, and its accept loop wakes every second
    assert _agents(testbed) == []
    assert not list(run_dir.glob("agent-*.sock"))
    assert {r["state"] for r in c.json("status")} == {"free"}  # and the next look starts one
    ((_, again),) = _wait_for_agents(testbed, 1)
    assert "serve-detached" in again  # started by sh, behind the look


def test_a_job_started_by_the_warm_agent_gets_no_dead_ssh_agent_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm agent outlives the SSH connection it came in on: an SSH_AUTH_SOCK forwarded
    then and closed since is not handed to tmux (and so to the job); a live one is."""
    from gpuclaim.node.tmux import _client_environment

    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.gone"))
    assert "SSH_AUTH_SOCK" not in _client_environment()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        live.bind(str(tmp_path / "agent.sock"))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
        assert _client_environment()["SSH_AUTH_SOCK"] == str(tmp_path / "agent.sock")
    finally:
        live.close()
