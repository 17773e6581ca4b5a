"""The cluster over SSH, end to end through the CLI against real sshd nodes on loopback."""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import gpu


def test_status_lists_every_gpu_of_three_nodes(testbed, make_remote):
    testbed.set_gpus("node01", [gpu(), gpu()])
    testbed.set_gpus(
        "node02",
        [
            gpu("NVIDIA L40S", 46068),
            gpu(
                "NVIDIA L40S",
                46068,
                utilization_pct=88,
                processes=[
                    {"pid": 4194500, "name": "/opt/conda/bin/python", "used_memory_mib": 30000}
                ],
            ),
        ],
    )
    testbed.set_gpus("node03", [gpu("NVIDIA A100-SXM4-80GB", 81920) for _ in range(3)])
    c = make_remote(testbed)
    proc = c.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["node"], r["index"]) for r in rows] == [
        ("node01", 0),
        ("node01", 1),
        ("node02", 0),
        ("node02", 1),
        ("node03", 0),
        ("node03", 1),
        ("node03", 2),
    ]
    by = {(r["node"], r["index"]): r for r in rows}
    assert by[("node02", 0)]["name"] == "NVIDIA L40S"
    assert by[("node02", 0)]["memory_total_mib"] == 46068
    assert by[("node03", 2)]["name"] == "NVIDIA A100-SXM4-80GB"
    busy = by[("node02", 1)]
    assert busy["state"] == "busy-unclaimed"
    assert busy["utilization_pct"] == 88
    assert busy["memory_used_mib"] == 30000
    assert [p["name"] for p in busy["processes"]] == ["/opt/conda/bin/python"]
    # UUIDs are the node's own (the fake derives them from node and index)
    assert len({r["uuid"] for r in rows}) == 7


def test_claim_and_release_over_ssh_with_a_live_job(testbed, make_remote):
    c = make_remote(testbed)
    claim = c.json("claim", "-n", "2", "--node", "node02", "--note", "remote")
    assert claim["node"] == "node02" and claim["gpus"] == [0, 1]
    # A process started on the node outside gpuclaim shows up through the node's nvidia-smi.
    job = testbed.ssh("node03", "CUDA_VISIBLE_DEVICES=3 nohup sleep 60 >/dev/null 2>&1 &")
    assert job.returncode == 0, job.stderr
    rows = c.by_gpu(user="bob")
    assert rows[("node02", 0)]["claim"]["user"] == "alice"
    assert rows[("node03", 3)]["state"] == "busy-unclaimed"
    c.ok("release", claim["id"])
    assert c.by_gpu()[("node02", 0)]["state"] == "free"


@pytest.fixture(params=["auto", "fabric"])
def client(request: pytest.FixtureRequest) -> str:
    """The SSH clients a user can get: the ssh binary ("auto" here) and paramiko; how a
    node fails must read the same through both."""
    return str(request.param)


def test_unreachable_node_is_a_row_and_exit_4(testbed, make_remote, client):
    c = make_remote(testbed, ssh_client=client)
    claim = c.json("claim", "--gpu", "node02:1")
    testbed.stop_node("node02")
    t0 = time.monotonic()
    proc = c.cli("status", "--json")
    took = time.monotonic() - t0
    assert proc.returncode == 4, proc.stderr
    rows = json.loads(proc.stdout)
    down = [r for r in rows if r["node"] == "node02"]
    # What the store knows about the dead node is still shown, marked unreachable.
    assert [(r["index"], r["state"], r["claim"]["id"]) for r in down] == [
        (1, "unreachable", claim["id"])
    ]
    assert "refused" in down[0]["reason"]
    assert {r["state"] for r in rows if r["node"] != "node02"} == {"free"}
    assert len([r for r in rows if r["node"] != "node02"]) == 8
    assert took < 3 + 1 + 2.5  # connect timeout + a second, + interpreter start-up
    # The table says it too, and claims still go to the living nodes.
    text = c.cli("status")
    assert text.returncode == 4 and "node02" in text.stdout and "unreachable" in text.stdout
    assert c.json("claim", "-n", "4")["node"] in ("node01", "node03")


def test_an_unknown_host_is_named_once(testbed, make_remote, client):
    extra = "\nHost nowhere\n    HostName nowhere.invalid\n"
    testbed.ssh_config.write_text(testbed.ssh_config.read_text() + extra)
    c = make_remote(testbed, nodes=["node01", "nowhere"], ssh_client=client)
    proc = c.cli("status")
    assert proc.returncode == 4, proc.stderr
    rows = proc.stdout.splitlines()
    (line,) = [x for x in rows if "unknown host" in x and "unreachable" not in x]
    assert line.startswith("nowhere: unknown host") and line.count("nowhere") == 1, line
    doctor = c.cli("doctor")
    assert "ssh nowhere true" in doctor.stdout, doctor.stdout  # the fix names the node
    assert "HOST" not in doctor.stdout


def test_hung_node_is_bounded_by_the_deadline(testbed, make_remote):
    # sshd answers but nvidia-smi hangs: the probe timeout and the deadline bound it.
    testbed.set_node("node01", delay_ms=60_000)
    c = make_remote(testbed, probe_timeout="2s", deadline="6s")
    t0 = time.monotonic()
    proc = c.cli("status", "--json")
    took = time.monotonic() - t0
    assert proc.returncode == 4
    rows = json.loads(proc.stdout)
    assert [r["state"] for r in rows if r["node"] == "node01"] == ["unreachable"]
    assert "did not answer within 2s" in rows[0]["reason"]
    assert took < 6 + 3


@contextlib.contextmanager
def _frozen(testbed, node: str):
    """The node's kernel accepts TCP but its sshd never speaks (frozen, swapping to death)."""
    port = testbed.ports[node]
    testbed.stop_node(node)
    held: list[socket.socket] = []
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()

        def accept_and_stay_silent() -> None:
            with contextlib.suppress(OSError):
                while True:
                    held.append(server.accept()[0])

        threading.Thread(target=accept_and_stay_silent, daemon=True).start()
        try:
            yield
        finally:
            for conn in held:
                conn.close()


def test_frozen_node_that_never_sends_a_banner_prints_no_library_traceback(
    testbed, make_remote, client
):
    c = make_remote(testbed, connect_timeout="2s", ssh_client=client)
    # node01 answers slowly, so the CLI is still running when paramiko's thread gives up
    testbed.set_node("node01", delay_ms=3500)
    with _frozen(testbed, "node02"):
        proc = c.cli("status", "--json")
        debug = c.cli("--debug", "status", "--json")
    assert proc.returncode == 4, proc.stderr
    rows = [r for r in json.loads(proc.stdout) if r["node"] == "node02"]
    assert rows and all(r["state"] == "unreachable" for r in rows)
    assert "no SSH banner within 2s" in rows[0]["reason"], rows[0]["reason"]
    # gpuclaim's own words reach the terminal; paramiko's thread's traceback does not...
    assert "Traceback" not in proc.stderr and "SSHException" not in proc.stderr, proc.stderr
    assert "paramiko" not in proc.stderr, proc.stderr
    # ... unless --debug asks for everything.
    assert debug.returncode == 4
    assert "banner" in debug.stderr.lower(), debug.stderr


def test_a_claim_that_fits_elsewhere_does_not_wait_for_a_hanging_node(testbed, make_remote):
    c = make_remote(testbed, connect_timeout="6s")
    c.ok("status")  # warm: the agent is on every node
    with _frozen(testbed, "node02"):
        t0 = time.monotonic()
        claim = c.json("claim", "-n", "2")
        took = time.monotonic() - t0
        assert claim["node"] in ("node01", "node03")
        assert took < 4, took  # well under the 6 s the frozen node would cost
        # what needs the frozen node still waits for it, and says why it failed
        t0 = time.monotonic()
        pinned = c.cli("claim", "-n", "1", "--node", "node02")
        waited = time.monotonic() - t0
        assert waited >= 5.5, (waited, pinned.returncode, pinned.stderr)
        assert pinned.returncode != 0 and "node02" in pinned.stderr, pinned.stderr
        # and a look at everything waits for everything
        status = c.cli("status", "--json")
        assert status.returncode == 4
    c.ok("release", claim["id"])


def test_fan_out_is_parallel(make_testbed, make_remote):
    tb = make_testbed(8, gpus=1)
    for node in tb.nodes:
        tb.set_node(node, delay_ms=1500)  # every nvidia-smi call takes 1.5 s
    c = make_remote(tb)
    t0 = time.monotonic()
    rows = c.status()
    took = time.monotonic() - t0
    assert len(rows) == 8
    # Two nvidia-smi calls per node: sequential would take 8 x 3 s = 24 s.
    assert took < 12, f"status over 8 slow nodes took {took:.1f}s: not parallel"


def test_driver_missing_node_falls_back_and_doctor_reports(testbed, make_remote):
    c = make_remote(testbed)
    inventory_source = c.json("doctor", expect=0)
    assert {h["gpu_source"] for h in inventory_source} == {"nvidia-smi"}  # no pynvml there
    assert all(h["storage"] == "ok" for h in inventory_source)
    assert all(abs(h["clock_skew_s"]) < 5 for h in inventory_source)
    testbed.set_node("node03", fail=True)
    proc = c.cli("doctor")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "node03: nvidia-smi cannot reach the NVIDIA driver" in proc.stdout
    assert "fix: install the NVIDIA driver" in proc.stdout
    rows = json.loads(c.cli("status", "--json").stdout)
    assert [r["state"] for r in rows if r["node"] == "node03"] == ["unreachable"]
    testbed.stop_node("node01")
    assert c.cli("doctor").returncode == 4


def test_changed_or_unknown_host_key_is_refused(testbed, make_remote, client):
    c = make_remote(testbed, ssh_client=client)
    assert c.cli("status").returncode == 0
    lines = testbed.known_hosts.read_text().splitlines()
    port1, port2 = testbed.ports["node01"], testbed.ports["node02"]
    key2 = next(line for line in lines if f"]:{port2} " in line).split(None, 1)[1]
    forged = [
        (line.split(None, 1)[0] + " " + key2) if f"]:{port1} " in line else line for line in lines
    ]
    testbed.known_hosts.write_text("\n".join(forged) + "\n")
    # A master is a connection whose key was checked: keys are checked when one is made
    # (a reinstalled node's reboot drops its master anyway).
    _close_masters(testbed)
    proc = c.cli("status", "--json")
    assert proc.returncode == 4
    row = next(r for r in json.loads(proc.stdout) if r["node"] == "node01")
    assert row["state"] == "unreachable"
    assert "HOST KEY CHANGED" in row["reason"]
    # plain ssh agrees that this is an attack, not a hiccup
    assert testbed.ssh("node01", "true").returncode != 0
    # unknown key: not in known_hosts at all
    testbed.known_hosts.write_text(
        "\n".join(line for line in lines if f"]:{port1} " not in line) + "\n"
    )
    _close_masters(testbed)
    row = next(r for r in json.loads(c.cli("status", "--json").stdout) if r["node"] == "node01")
    assert "unknown host key" in row["reason"]


def _close_masters(testbed) -> None:
    """End the ssh masters gpuclaim keeps for the testbed's nodes (as ControlPersist would)."""
    from gpuclaim.remote.openssh import control_dir

    ctl = ["-F", str(testbed.ssh_config), "-o", f"ControlPath={control_dir()}/%C"]
    for node in testbed.nodes:
        subprocess.run(["ssh", *ctl, "-O", "exit", node], capture_output=True)


def test_proxyjump_through_a_jump_host(make_testbed, make_remote, client):
    tb = make_testbed(1, gpus=2, jump=True)
    c = make_remote(tb, nodes=["node01", "hidden01"], ssh_client=client)
    rows = c.status()
    assert {r["node"] for r in rows} == {"node01", "hidden01"}
    assert all(r["state"] == "free" for r in rows)
    log = tb.log_path(tb.jump_host).read_text()
    assert "direct-tcpip" in log


def test_include_in_ssh_config_is_honoured(testbed, make_remote, tmp_path, client):
    wrapper = tmp_path / "ssh_config_with_include"
    wrapper.write_text(f"# top-level file\nInclude {testbed.ssh_config}\n")
    c = make_remote(testbed, ssh_client=client)
    proc = c.cli("status", "--json", GPUCLAIM_SSH_CONFIG=str(wrapper))
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == 12


def _node_python_tag(testbed) -> str:
    proc = subprocess.run(
        ["ssh", "-F", str(testbed.ssh_config), "node01", "python3", "-c", _TAG],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.stdout.strip()


_TAG = "'import sys; print(sys.implementation.cache_tag)'"


def test_agent_is_sent_once_and_cached_by_version(testbed, make_remote, client):
    c = make_remote(testbed, ssh_client=client)
    c.ok("status")
    cache = testbed.node_dir("node01") / "home" / ".cache" / "gpuclaim"

    def sent() -> list[Path]:
        return [*cache.glob("agent-*.pyz"), *cache.glob("agent-*/__main__.py")]

    # the ssh binary's first look needs no agent: it is sent behind the command, after it
    deadline = time.monotonic() + 30
    while not sent() and time.monotonic() < deadline:
        time.sleep(0.05)
    cached = sent()
    assert len(cached) == 1
    if _node_python_tag(testbed) == sys.implementation.cache_tag:
        # the node's python3 is the CLI's: the agent is the one zip file, its bytecode used
        assert cached[0].suffix == ".pyz" and cached[0].is_file()
        assert not [p for p in cache.rglob("*") if p.suffix == ".pyc"]
    first = cached[0].stat().st_mtime_ns
    c.ok("status")
    assert cached[0].stat().st_mtime_ns == first  # not re-sent


def test_storage_over_ssh_claim_release_and_clock(testbed, make_remote):
    root = testbed.dir / "srv-store"
    root.mkdir()  # as the admin makes it on the storage host
    c = make_remote(testbed, storage=f"ssh://node01{root}")
    claim = c.json("claim", "-n", "1", "--node", "node03", "--time", "1h")
    # The claim file lives on the storage host, written there by the agent.
    files = list((root / "gpus").glob("*.claim"))
    assert [json.loads(f.read_text())["id"] for f in files] == [claim["id"]]
    assert c.by_gpu(user="bob")[("node03", 0)]["claim"]["user"] == "alice"
    c.ok("release", claim["id"])
    assert not list((root / "gpus").glob("*.claim"))
    assert c.json("history")[0]["claims"] == 1


def _ssh_racer(env: dict, user: str, rounds: int, barrier, out: str, seed: int) -> None:
    from gpuclaim.entry.main import main

    os.environ.update(env)
    os.environ["GPUCLAIM_USER"] = user
    rng = random.Random(seed)
    with open(out, "w") as fh:
        for r in range(rounds):
            barrier.wait(timeout=120)
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
                rc = main(["claim", "-n", str(rng.choice((1, 2))), "--node", "node02", "--json"])
            claim = json.loads(buf.getvalue()) if rc == 0 else None
            fh.write(json.dumps({"round": r, "rc": rc, "claim": claim}) + "\n")
            fh.flush()
            barrier.wait(timeout=120)
            barrier.wait(timeout=120)
            if claim is not None:
                with contextlib.redirect_stdout(io.StringIO()):
                    assert main(["release", claim["id"]]) == 0


def test_two_users_racing_through_ssh_storage_never_share(testbed, make_remote, tmp_path):
    root = testbed.dir / "race-store"
    root.mkdir()
    c = make_remote(testbed, storage=f"ssh://node01{root}")
    rounds, workers = 12, 4
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(workers + 1)
    outs = [tmp_path / f"w{i}.jsonl" for i in range(workers)]
    users = ["alice", "bob", "alice", "bob"]
    procs = [
        ctx.Process(target=_ssh_racer, args=(c.env(), users[i], rounds, barrier, str(outs[i]), i))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    granted_total = 0
    try:
        for r in range(rounds):
            barrier.wait(timeout=120)
            barrier.wait(timeout=120)
            results = [json.loads(o.read_text().splitlines()[-1]) for o in outs]
            assert all(res["round"] == r and res["rc"] in (0, 3) for res in results), results
            won = [res["claim"] for res in results if res["rc"] == 0]
            uuids = [u for cl in won for u in cl["gpu_uuids"]]
            assert len(uuids) == len(set(uuids)), f"round {r}: a GPU granted twice"
            on_disk = {json.loads(f.read_text())["id"] for f in (root / "gpus").glob("*.claim")}
            assert on_disk == {cl["id"] for cl in won}
            granted_total += len(won)
            barrier.wait(timeout=120)
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert granted_total >= rounds


def test_openssh_transport_with_controlmaster(testbed, make_remote):
    """ssh_client = "openssh": the ssh binary, masters kept between calls."""
    c = make_remote(testbed, ssh_client="openssh")
    env_dir = Path(tempfile.mkdtemp(prefix="gcrt-", dir="/tmp"))  # socket paths must be short
    extra = {"XDG_RUNTIME_DIR": str(env_dir)}
    proc = c.cli("status", "--json", **extra)
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == 12
    masters = [p for p in (env_dir / "gpuclaim-cm").iterdir() if p.name != "w"]  # w: warm
    assert len(masters) == 3  # one persistent master per node
    # jobs go through it too
    proc = c.cli("run", "--name", "via-openssh", "--", "true", **extra)
    assert proc.returncode == 0, proc.stderr
    # a dead node is still a row and exit 4
    testbed.stop_node("node02")
    subprocess_exit = c.cli("status", "--json", **extra)
    assert subprocess_exit.returncode == 4
    rows = json.loads(subprocess_exit.stdout)
    assert {r["state"] for r in rows if r["node"] == "node02"} == {"unreachable"}
    for master in masters:  # the masters persist on purpose: close them
        subprocess.run(
            ["ssh", "-o", f"ControlPath={master}", "-O", "exit", "x"], capture_output=True
        )
    shutil.rmtree(env_dir, ignore_errors=True)


def test_a_jobs_gpus_show_the_jobs_time_left_and_short_names_the_node(testbed, make_remote):
    c = make_remote(testbed, nodes=["node01"])
    c.ok("run", "--time", "10m", "--name", "ten", "--", "sleep", "120")
    deadline = time.monotonic() + 20
    while next(j for j in c.json("jobs") if j["name"] == "ten")["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    row = next(line for line in c.ok("status").splitlines() if "job ten" in line)
    assert " 9m" in row or " 10m" in row, row  # the job's 10 minutes, not its claim's 12
    # from a laptop, bare indices would name GPUs of this machine: say which node
    short = c.cli("claim", "-n", "1", "--short")
    assert short.returncode == 0, short.stderr
    node, _, indices = short.stdout.strip().partition(":")
    assert node == "node01" and indices.isdigit(), short.stdout
    c.ok("kill", "ten")
    c.ok("release", "--all")


def test_openssh_transport_reads_the_same_ssh_config_as_everything_else(testbed, make_remote):
    # No ssh_config in gpuclaim's config and a $HOME that is not the passwd home: the node
    # aliases are only in $HOME/.ssh/config, which paramiko's side reads; the ssh binary
    # (ssh_client = "openssh") reads the passwd home's unless it is told.
    import pwd

    c = make_remote(testbed, nodes=["node01"], ssh_client="openssh")
    home = c.root / "laptop-home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copyfile(testbed.ssh_config, home / ".ssh" / "config")
    lines = c.config_path.read_text().splitlines(keepends=True)
    c.config_path.write_text("".join(x for x in lines if not x.startswith("ssh_config")))
    assert Path(pwd.getpwuid(os.getuid()).pw_dir).resolve() != home.resolve()
    proc = c.cli("status", "--json", HOME=str(home))
    assert proc.returncode == 0, proc.stderr
    assert {r["state"] for r in json.loads(proc.stdout)} == {"free"}


def test_a_node_where_the_agent_cannot_be_installed_is_one_line(testbed, make_remote):
    """~/.cache/gpuclaim is a file on node02: that node's rows say why, the others answer."""
    cache = testbed.node_dir("node02") / "home" / ".cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "gpuclaim").write_text("not a directory\n")
    c = make_remote(testbed)
    proc = c.cli("status", "--json")
    assert proc.returncode == 4 and "Traceback" not in proc.stderr, proc.stderr
    rows = json.loads(proc.stdout)
    assert {r["node"] for r in rows if r["state"] != "unreachable"} == {"node01", "node03"}
    (reason,) = {r["reason"] for r in rows if r["node"] == "node02"}
    assert reason.startswith("node02: cannot install the gpuclaim agent in ~/.cache/gpuclaim:")
    assert reason.endswith("File exists") and "\n" not in reason
    text = c.cli("status")
    assert text.returncode == 4 and "Traceback" not in text.stderr
    assert "node02: cannot install the gpuclaim agent" in text.stdout
    assert (cache / "gpuclaim").read_text() == "not a directory\n"  # nothing of the user's lost


@pytest.mark.parametrize("nvml", [False, True])
def test_doctor_names_the_gpus_whose_persistence_mode_is_off(make_testbed, make_remote, nvml):
    """Without persistence mode every nvidia-smi call (and NVML start) wakes the driver: the
    slow part of a look on real nodes. doctor says which GPUs, and the fix, on both paths."""
    tb = make_testbed(2, 2, nvml=nvml)
    gpu = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}
    tb.set_gpus("node02", [dict(gpu), dict(gpu, persistence=False)])
    c = make_remote(tb)
    proc = c.cli("doctor")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if "persistence mode" in ln]
    assert line.strip().startswith("node02: persistence mode is off on GPU 1:"), line
    assert "fix: sudo nvidia-smi -pm 1" in proc.stdout
    report = {h["node"]: h for h in json.loads(c.cli("doctor", "--json").stdout)}
    assert report["node01"]["problems"] == []
    assert report["node02"]["gpu_source"] == ("nvml" if nvml else "nvidia-smi")


def test_fabric_connections_made_at_once_from_many_threads_all_see_their_config(
    tmp_path, monkeypatch
):
    """invoke's Config merges lazily and is not thread-safe: connections a fan-out builds at
    once from one shared Config saw it half-merged ("No attribute or config key found for
    'user'", with --debug's logging widening the window). Each gets its own copy now."""
    import logging

    from gpuclaim.remote import ssh

    hosts = 32
    config = tmp_path / "ssh_config"
    config.write_text(
        "".join(
            f"Host n{i}\n  HostName 127.0.0.1\n  Port {2200 + i}\n  User u{i}\n"
            for i in range(hosts)
        )
    )
    pool = ssh.SshPool(config, connect_timeout=2)
    cls = ssh._connection_class(2)
    monkeypatch.setattr(cls, "open", lambda self: None)  # no network: the config is the point
    monkeypatch.setattr(logging.getLogger("invoke"), "level", logging.DEBUG)
    got: dict[int, object] = {}

    def connect(i: int) -> None:
        try:
            got[i] = pool.connection(f"n{i}").user
        except Exception as exc:
            got[i] = exc

    for _ in range(5):
        got.clear()
        pool._fabric_config = None
        pool._conns.clear()
        threads = [threading.Thread(target=connect, args=(i,)) for i in range(hosts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == {i: f"u{i}" for i in range(hosts)}


def test_a_node_of_another_python_unpacks_the_sources(testbed, tmp_path):
    """The zip's bytecode is for the CLI's Python; a node of another version unpacks the
    sources (its python3 compiles them once), and answers the request in the same run."""
    from gpuclaim.remote import install
    from gpuclaim.remote.bundle import agent_bundle

    version, blob = agent_bundle()
    request = json.dumps({"op": "ping"}).encode() + b"\n"
    ssh = ["ssh", "-F", str(testbed.ssh_config), "node02"]
    command = install.install_command(version, "cpython-0")  # not this node's Python
    proc = subprocess.run(
        [*ssh, command], input=request + install.install_stdin(blob), capture_output=True
    )
    assert proc.returncode == 0, proc.stderr
    need, answer = proc.stdout.splitlines()
    assert need + b"\n" == install.NEED and json.loads(answer)["result"]["version"]
    home = testbed.node_dir("node02") / "home" / ".cache" / "gpuclaim"
    agent = home / f"agent-{version}"
    assert (agent / "__main__.py").is_file() and not (home / f"agent-{version}.pyz").exists()
    assert all(p.parent.name == "__pycache__" for p in agent.rglob("*.pyc"))  # its own
    assert not [p.name for p in home.iterdir() if p.name.endswith(".tmp")]
    # installed: the plain command finds it and answers, with no archive sent
    again = subprocess.run(
        [*ssh, install.run_command(version)], input=request, capture_output=True, timeout=30
    )
    assert again.returncode == 0 and json.loads(again.stdout)["result"]["version"], again.stderr


def test_the_archive_goes_only_to_a_node_that_asks(testbed):
    """The first contact over the ssh binary is a conversation: the request first, the
    archive only after the node says it lacks the agent; one session either way."""
    from gpuclaim.remote import install
    from gpuclaim.remote.bundle import agent_bundle
    from gpuclaim.remote.openssh import OpenSshPool

    version, blob = agent_bundle()
    pool = OpenSshPool(testbed.ssh_config)
    asked: list[bytes] = []

    def then(line: bytes) -> bytes | None:
        asked.append(line)
        return install.install_stdin(blob) if line == install.NEED else None

    request = json.dumps({"op": "ping"}).encode() + b"\n"
    command = install.install_command(version, sys.implementation.cache_tag)
    try:
        for _ in range(2):
            result = pool.converse("node03", command, request, then, timeout=30)
            assert result.exit_code == 0, result.stderr
            assert json.loads(result.stdout.splitlines()[-1])["result"]["version"]
    finally:
        pool.forget("node03")
    assert asked[0] == install.NEED  # the first time: missing, so it asked
    assert asked[1] != install.NEED and json.loads(asked[1])  # then: the answer at once
