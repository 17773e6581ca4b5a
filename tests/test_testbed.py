"""The SSH testbed itself, proven with real ssh against its real sshd nodes."""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import pytest
import testbed as testbed_module
import testbed_fixtures
from testbed import MissingTool, Testbed, TestbedError, is_alive, require_tools
from testbed_fixtures import MakeTestbed

from gpuclaim.sim.fake_nvidia_smi import sim_uuid

QUERY = "nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits"
TESTBED_PY = Path(__file__).with_name("testbed.py")
H100 = "NVIDIA H100 80GB HBM3"

# the fixtures, by assignment: importing them by name and then taking them as arguments
# is F811 (redefinition of an unused import) to ruff
make_testbed = testbed_fixtures.make_testbed
testbed = testbed_fixtures.testbed


def fan_out(
    tb: Testbed, command: str, nodes: Optional[list[str]] = None
) -> dict[str, subprocess.CompletedProcess[str]]:
    """``ssh node command`` on every node at once (one at a time costs ~0.3 s each here)."""
    procs = {
        node: subprocess.Popen(
            ["ssh", "-F", str(tb.ssh_config), node, command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in nodes or tb.nodes
    }
    results = {}
    for node, proc in procs.items():
        out, err = proc.communicate(timeout=30)
        results[node] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return results


def gpu_rows(stdout: str) -> list[tuple[str, ...]]:
    return [tuple(c.strip() for c in line.split(",")) for line in stdout.splitlines()]


def processes_of(directory: Path, cmdline: Optional[bytes] = None) -> list[int]:
    """Live processes whose environment names this testbed (and with this command line)."""
    marker = f"GPUCLAIM_TESTBED={directory}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker not in environ.split(b"\0") or (cmdline and argv != cmdline):
            continue
        if is_alive(int(entry)):
            found.append(int(entry))
    return found


def ssh_seconds(tb: Testbed, delayed: bool) -> float:
    # curve25519 spends ~5 ms of CPU where the default kex spends ~75 ms: less noise when
    # other tests load the 2 CPUs, so the proxy's round trips dominate
    kex = ["-o", "KexAlgorithms=curve25519-sha256"]
    started = time.monotonic()
    result = tb.ssh("node01", "true", delayed=delayed, options=kex)
    assert result.returncode == 0, result.stderr
    return time.monotonic() - started


def banner_seconds(port: int) -> float:
    """Connect and read the SSH version banner, which the server sends first."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        assert sock.recv(256).startswith(b"SSH-2.0-")
    return time.monotonic() - started


def test_every_node_answers_with_its_own_name_home_and_tmux_dir(testbed: Testbed) -> None:
    results = fan_out(testbed, 'echo "$GPUCLAIM_NODE $HOME $TMUX_TMPDIR $GPUCLAIM_TESTBED"')
    for node, result in results.items():
        assert result.returncode == 0, result.stderr
        home, run = testbed.node_dir(node) / "home", testbed.node_dir(node) / "run"
        assert result.stdout.split() == [node, str(home), str(run), str(testbed.dir)]
    assert testbed.nodes == ["node01", "node02", "node03"]
    assert testbed.env()["GPUCLAIM_SSH_CONFIG"] == str(testbed.ssh_config)


def test_host_keys_are_checked_strictly(testbed: Testbed, tmp_path: Path) -> None:
    # node01's entry given node02's key: ssh must refuse, so the known_hosts is really used
    lines = testbed.known_hosts.read_text().splitlines()
    forged = [lines[0].split()[0] + " " + " ".join(lines[1].split()[1:]), *lines[1:]]
    wrong = tmp_path / "known_hosts"
    wrong.write_text("\n".join(forged) + "\n")
    result = testbed.ssh("node01", "true", options=["-o", f"UserKnownHostsFile={wrong}"])
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr


def test_nvidia_smi_over_ssh_shows_each_nodes_gpus(testbed: Testbed) -> None:
    for node, result in fan_out(testbed, QUERY).items():
        assert result.returncode == 0, result.stderr
        assert gpu_rows(result.stdout) == [
            (str(i), sim_uuid(node, i), H100, "81559") for i in range(4)
        ]


def test_a_changed_gpu_state_is_seen_on_the_next_call(testbed: Testbed) -> None:
    testbed.set_gpus("node02", [{"name": "NVIDIA L40S", "memory_total_mib": 46068}] * 2)
    testbed.set_node("node03", fail=True)
    results = fan_out(testbed, QUERY)
    assert [r[2:] for r in gpu_rows(results["node02"].stdout)] == [("NVIDIA L40S", "46068")] * 2
    assert results["node03"].returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in results["node03"].stdout
    assert len(gpu_rows(results["node01"].stdout)) == 4
    testbed.set_node("node03", fail=None)
    assert testbed.ssh("node03", QUERY).returncode == 0


def test_stop_node_fails_fast_and_start_node_brings_it_back(testbed: Testbed) -> None:
    port = testbed.ports["node02"]
    testbed.stop_node("node02")
    started = time.monotonic()
    dead = testbed.ssh("node02", "true")
    assert time.monotonic() - started < 2
    assert dead.returncode == 255
    assert "Connection refused" in dead.stderr
    assert not testbed.status()["node02"]["up"]
    assert testbed.status()["node01"]["up"]

    testbed.start_node("node02")
    assert testbed.ports["node02"] == port
    results = fan_out(testbed, "echo $GPUCLAIM_NODE")
    assert {n: r.stdout.strip() for n, r in results.items()} == {n: n for n in testbed.nodes}


def test_each_node_has_its_own_tmux_server(testbed: Testbed) -> None:
    started = testbed.ssh("node01", "tmux new-session -d -s tbjob 'sleep 300' && tmux ls")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("tbjob:")
    other = testbed.ssh("node02", "tmux ls")
    assert other.returncode == 1  # no server on node02, not node01's session
    sock = f"run/tmux-{os.getuid()}/default"
    assert (testbed.node_dir("node01") / sock).is_socket()
    assert not (testbed.node_dir("node02") / sock).exists()


def test_delay_proxy_adds_round_trips(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(1, gpus=1, delay_ms=30)
    assert tb.ssh_config_delayed is not None
    # 1.5 RTT connect hold + 0.5 RTT for the banner; the direct banner is not compared:
    # under load sshd's fork and re-exec alone took 50 ms here
    assert banner_seconds(tb.proxy_ports["node01"]) >= 0.055
    # a new ssh connection costs ~9 round trips more (~0.25 s); best of 5 interleaved pairs,
    # since load only ever adds time. The floor (5 RTT) holds however busy the CPUs are.
    times = [(ssh_seconds(tb, delayed=False), ssh_seconds(tb, delayed=True)) for _ in range(5)]
    direct, delayed = min(t[0] for t in times), min(t[1] for t in times)
    assert delayed >= 0.15, times
    assert delayed > direct + 0.04, times
    result = tb.ssh("node01", "echo $GPUCLAIM_NODE", delayed=True)
    assert result.stdout.strip() == "node01"


def test_jump_host_forwards_to_the_hidden_node(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(1, gpus=2, jump=True)
    assert "ProxyJump jump" in tb.ssh_config.read_text()
    result = tb.ssh("hidden01", f"echo ok; echo $GPUCLAIM_NODE; {QUERY}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["ok", "hidden01"]
    assert [r[1] for r in gpu_rows("\n".join(lines[2:]))] == [
        sim_uuid("hidden01", i) for i in (0, 1)
    ]
    jump_log = tb.log_path("jump").read_text()
    assert "server_request_direct_tcpip" in jump_log
    assert f"target 127.0.0.1 port {tb.ports['hidden01']}" in jump_log


def test_parallel_testbeds_get_their_own_ports(make_testbed: MakeTestbed) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda _: make_testbed(2, gpus=1), range(2))
    assert not set(a.ports.values()) & set(b.ports.values())
    for tb in (a, b):
        lines = (tb.dir / "ports").read_text().split()
        assert dict(zip(lines[::2], map(int, lines[1::2]))) == tb.ports
        answer = tb.ssh("node02", "echo $GPUCLAIM_TESTBED")
        assert answer.stdout.strip() == str(tb.dir)


def test_down_leaves_nothing_running(make_testbed: MakeTestbed) -> None:
    tb = make_testbed(2, gpus=1)
    # leftovers of every kind: a nohup job, a HUP-proof tmux job, a live ssh session
    spawn = "nohup sleep 300 >/dev/null 2>&1 & tmux new -d -s job 'trap \"\" HUP; sleep 300'"
    assert tb.ssh("node01", spawn).returncode == 0
    session = subprocess.Popen(
        ["ssh", "-F", str(tb.ssh_config), "node02", "sleep 300"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while len(processes_of(tb.dir, b"sleep\x00300\x00")) < 3:
        assert time.monotonic() < deadline, "the three sleeps did not start"
        time.sleep(0.05)
    recorded = [pid for pid, _ in tb.read_pids().values()]
    assert recorded and all(is_alive(pid) for pid in recorded)

    started = time.monotonic()
    tb.down()
    assert time.monotonic() - started < 5
    assert not tb.dir.exists()
    assert not [pid for pid in recorded if is_alive(pid)]
    assert processes_of(tb.dir) == []
    assert session.wait(timeout=5) != 0  # the client named the testbed's files: swept too
    tb.down()  # idempotent


def test_failed_up_tears_down_what_it_started(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fail(self: Testbed) -> None:
        seen["dir"], seen["pids"] = self.dir, [p for p, _ in self.read_pids().values()]
        raise TestbedError("injected failure")

    monkeypatch.setattr(Testbed, "_write_client_files", fail)
    with pytest.raises(TestbedError, match="injected"):
        Testbed.up(2, gpus=1, delay_ms=10)
    assert len(seen["pids"]) == 3  # two sshd and the proxy had started
    assert not seen["dir"].exists()
    assert not [pid for pid in seen["pids"] if is_alive(pid)]


def test_up_retries_a_port_taken_before_sshd_binds_it(
    make_testbed: MakeTestbed, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_free_ports = testbed_module.free_ports
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        calls: list[int] = []

        def first_one_taken(count: int) -> list[int]:
            calls.append(count)
            ports = real_free_ports(count)
            return [taken, *ports[1:]] if len(calls) == 1 else ports

        monkeypatch.setattr(testbed_module, "free_ports", first_one_taken)
        tb = make_testbed(2, gpus=1)
    assert calls == [2, 1]
    assert taken not in tb.ports.values()
    assert tb.ssh("node01", "echo $GPUCLAIM_NODE").stdout.strip() == "node01"


def test_cli_up_status_stop_start_down() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(TESTBED_PY), *args],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    up = cli("up", "2", "--gpus", "1")
    assert up.returncode == 0, up.stderr
    directory = up.stdout.strip()
    try:
        assert Path(directory, "ssh_config").is_file()
        assert cli("status", directory).returncode == 0
        assert cli("stop-node", directory, "node02").returncode == 0
        status = cli("status", directory)
        assert status.returncode == 1
        assert "DOWN" in status.stdout
        assert cli("start-node", directory, "node02").returncode == 0
        assert cli("status", directory).returncode == 0
        assert cli("down", directory).returncode == 0
        assert not Path(directory).exists()
        assert cli("down", directory).returncode == 0
    finally:
        if Path(directory).exists():
            Testbed.load(Path(directory)).down()


def test_missing_sshd_names_the_package_to_install() -> None:
    with pytest.raises(MissingTool, match="openssh-server"):
        require_tools(path="/nonexistent")
