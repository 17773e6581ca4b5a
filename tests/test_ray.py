"""[ray] ``run --ray``: a Ray cluster of the job's own over its ranks, with real Ray (from PyPI,
in a venv of the test's, CPU only) on the sshd testbed, driven through the CLI. The command
runs on rank 0 against it; its tasks run on both nodes with the GPUs each node claimed; the
command's exit code is the job's; after it, or a kill, no Ray process of the job is left and
the GPUs are free; two Ray jobs on one node are two clusters on ports of their own; a node
without Ray is one line, exit 2, nothing claimed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.ssh

# the Ray this suite runs against (a user's own dependency: any recent one), with its dashboard
RAY = "ray[default]==2.60.0"

# Reports, from a task pinned to each node, where it ran and the GPUs Ray gave it.
REPORT = """
import json, os, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On
ray.init()
print("address=" + os.environ["RAY_ADDRESS"], flush=True)
nodes = [n for n in ray.nodes() if n["Alive"]]
@ray.remote(num_gpus=1, num_cpus=0)
def where():
    return {"node": os.environ.get("GPUCLAIM_NODE"),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ids": [str(i) for i in ray.get_gpu_ids()]}
got = ray.get([where.options(scheduling_strategy=On(n["NodeID"], soft=False)).remote()
               for n in nodes])
print("report=" + json.dumps({"nodes": len(nodes), "tasks": got}), flush=True)
raise SystemExit(int(os.environ.get("EXIT_WITH", "0")))
"""


@pytest.fixture(scope="session")
def ray_venv() -> Path:
    """A venv with Ray, made once per machine and Ray version (tests of both xdist workers
    share it; a lock makes it once)."""
    from filelock import FileLock

    tag = RAY.replace("[", "-").replace("]", "").replace("==", "-")
    where = Path(tempfile.gettempdir()) / f"gpuclaim-test-venv-{tag}"
    with FileLock(str(where) + ".lock", timeout=900):
        if not (where / "bin" / "ray").exists():
            subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
            pip = [str(where / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
            done = subprocess.run([*pip, RAY], capture_output=True, text=True, timeout=900)
            assert done.returncode == 0, f"pip install {RAY}:\n{done.stderr[-3000:]}"
    return where


@pytest.fixture
def rc(make_testbed: Any, make_remote: Any) -> Any:
    tb = make_testbed(2, 2)
    return make_remote(tb, kill_grace="2s", heartbeat="1s")


def _job(c: Any, name: str) -> dict[str, Any]:
    return next(j for j in c.json("jobs", "--all") if j["name"] == name)


def _until(c: Any, name: str, states: set[str], timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(c, name)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"{name} is {job['state']}: {job.get('reason')}"
        time.sleep(0.5)


def _log(c: Any, name: str, rank: int = 0) -> str:
    return c.ok("logs", name, "--rank", str(rank), "-n", "0")


def _ray_processes(job_id: str) -> list[int]:
    """Processes of this machine (every testbed node is one) carrying the job's Ray mark."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(f"GPUCLAIM_RAY_NODE={job_id}-".encode()) for e in env):
            found.append(int(entry.name))
    return found


def _no_ray_left(job_id: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _ray_processes(job_id):
        assert time.monotonic() < deadline, (
            f"Ray processes of {job_id} left: {_ray_processes(job_id)}"
        )
        time.sleep(0.3)


def _all_free(rc: Any, but: tuple[tuple[str, int], ...] = ()) -> None:
    """Every GPU (but those) free, soon: the ranks' claims go back as each rank ends."""
    deadline = time.monotonic() + 20
    while True:
        rows = [r for r in rc.status() if (r["node"], r["index"]) not in but]
        if all(r["state"] == "free" for r in rows):
            return
        assert time.monotonic() < deadline, [
            (r["node"], r["gpu"], r["state"], r.get("processes")) for r in rows
        ]
        time.sleep(0.5)


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "report.py"
    path.write_text(text)
    return path


def test_a_two_node_ray_job_runs_on_both_nodes_with_their_gpus_and_leaves_nothing(
    rc: Any, ray_venv: Path, tmp_path: Path
) -> None:
    script = _script(tmp_path, REPORT)
    # bob holds node02's GPU 0: the job gets GPU 1 there, so each node's index is its own
    rc.ok("claim", "--gpu", "node02:0", "--time", "10m", user="bob")
    argv = ["run", "--ray", "--nodes", "2", "-n", "1", "--ray-cpus", "1", "--venv", str(ray_venv)]
    job = rc.json(*argv, "--name", "tune", "--", "python", str(script))
    done = _until(rc, "tune", {"succeeded", "failed", "killed", "lost"})
    log = _log(rc, "tune")
    assert done["state"] == "succeeded" and done["exit_code"] == 0, (done, log)
    report = json.loads(log.split("report=", 1)[1].splitlines()[0])
    assert report["nodes"] == 2, report
    claimed = {r["node"]: str(r["gpus"][0]) for r in done["ranks"]}
    assert claimed == {"node01": "0", "node02": "1"}, done["ranks"]
    assert sorted(t["node"] for t in report["tasks"]) == sorted(claimed), report
    for task in report["tasks"]:  # Ray gave each task the GPU its node claimed, and no other
        assert task["visible"] == claimed[task["node"]], (task, claimed)
        assert task["ids"] == [claimed[task["node"]]], task
    assert "joining the Ray head at" in _log(rc, "tune", 1)
    _no_ray_left(job["id"])
    _all_free(rc, but=(("node02", 0),))

    # the command's exit code is the job's
    failing = rc.json(*argv, "--name", "bad", "--env", "EXIT_WITH=3", "--", "python", str(script))
    bad = _until(rc, "bad", {"succeeded", "failed", "killed", "lost"})
    assert (bad["state"], bad["exit_code"]) == ("failed", 3), bad
    _no_ray_left(failing["id"])
    rc.ok("release", "--gpu", "node02:0", user="bob")
    _all_free(rc)


def test_a_killed_ray_job_leaves_no_ray_process_and_frees_its_gpus(
    rc: Any, ray_venv: Path, tmp_path: Path
) -> None:
    script = _script(
        tmp_path, "import ray, time; ray.init(); print('up', flush=True); time.sleep(600)"
    )
    job = rc.json(
        "run", "--ray", "--nodes", "2", "-n", "1", "--ray-cpus", "1", "--venv", str(ray_venv),
        "--name", "long", "--", "python", str(script),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while "up" not in _log(rc, "long").split("Ray cluster up", 1)[-1]:
        assert time.monotonic() < deadline, _log(rc, "long")
        time.sleep(0.5)
    assert _ray_processes(job["id"])
    # its cluster takes only its own: a client without the job's token is refused
    address = _log(rc, "long").split("Ray head at ", 1)[1].split(";")[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    stranger = subprocess.run(
        [str(ray_venv / "bin" / "python"), "-c", f"import ray; ray.init(address={address!r})"],
        env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "not-the-jobs"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stranger.returncode != 0, stranger.stdout + stranger.stderr
    # ... and one with it (from the rank's owner-only spec file) gets in
    spec = json.loads((Path(job["log"]).parent / "spec.json").read_text())
    owner = subprocess.run(
        [str(ray_venv / "bin" / "python"), "-c", f"import ray; ray.init(address={address!r})"],
        env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": spec["ray_token"]},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert owner.returncode == 0, owner.stdout + owner.stderr
    assert oct((Path(job["log"]).parent / "spec.json").stat().st_mode & 0o777) == "0o600"
    _dashboard_answers(rc, spec["ray_token"])
    rc.ok("kill", "long")
    assert _until(rc, "long", {"killed"}, timeout=40)["state"] == "killed"
    _no_ray_left(job["id"])
    _all_free(rc)


def _dashboard_answers(rc: Any, token: str) -> None:
    """forward --dashboard tunnels the head's dashboard here; it asks for the job's token."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + 60
    while not (_job(rc, "long").get("ray_head") or {}).get("dashboard"):
        assert time.monotonic() < deadline, _job(rc, "long").get("ray_head")
        time.sleep(0.5)
    port = _free_port()
    printed = rc.ok("forward", "long", "--dashboard", "--port", str(port), "--print")
    head = _job(rc, "long")["ray_head"]
    assert f"127.0.0.1:{port}:127.0.0.1:{head['dashboard_port']}" in printed, printed
    tunnel = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", "forward", "long", "--dashboard", "--port", str(port)],
        env=rc.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/api/version"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=5)
                raise AssertionError("the dashboard answered without the token")
            except urllib.error.HTTPError as exc:
                assert exc.code == 401, exc
                break
            except OSError:
                assert time.monotonic() < deadline and tunnel.poll() is None, tunnel.stderr
                time.sleep(0.3)
        asked = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(asked, timeout=10) as answer:
            assert json.loads(answer.read())["ray_version"] == RAY.split("==")[1]
    finally:
        tunnel.terminate()
        _, said = tunnel.communicate(timeout=10)
    assert f"the dashboard asks for the job's Ray token: {token}" in said, said


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_ray_jobs_on_one_node_are_two_clusters_on_ports_of_their_own(
    rc: Any, ray_venv: Path, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    text = REPORT.replace(
        "got = ", f"import time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.2)\ngot = "
    )
    script = _script(tmp_path, text)
    jobs = []
    for name in ("one", "two"):
        jobs.append(
            rc.json(
                "run", "--ray", "-n", "1", "--node", "node01", "--ray-cpus", "1",
                "--venv", str(ray_venv), "--name", name, "--", "python", str(script),
            )
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while not all("address=" in _log(rc, name) for name in ("one", "two")):
        assert time.monotonic() < deadline, [_log(rc, n) for n in ("one", "two")]
        time.sleep(0.5)
    go.touch()
    reports, addresses = [], []
    for name in ("one", "two"):
        done = _until(rc, name, {"succeeded", "failed", "killed", "lost"})
        log = _log(rc, name)
        assert done["state"] == "succeeded", (done, log)
        addresses.append(log.split("address=", 1)[1].split()[0])
        reports.append(json.loads(log.split("report=", 1)[1].splitlines()[0]))
    assert addresses[0] != addresses[1], addresses  # two heads, on two ports
    assert [r["nodes"] for r in reports] == [1, 1]  # neither joined the other's cluster
    visible = sorted(r["tasks"][0]["visible"] for r in reports)
    assert visible == ["0", "1"], reports  # each with its own GPU of node01
    for job in jobs:
        _no_ray_left(job["id"])


def test_a_node_without_ray_is_one_line_exit_2_and_nothing_claimed(rc: Any, tmp_path: Path) -> None:
    plain = tmp_path / "plain-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(plain)], check=True)
    for venv in (str(plain), str(tmp_path / "missing")):
        proc = rc.cli("run", "--ray", "-n", "1", "--venv", venv, "--", "python", "-c", "1")
        assert proc.returncode == 2, proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.startswith("gpuclaim: error")]
        assert len(lines) == 1 and "run --ray needs Ray" in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
    assert "no ray in the venv" in proc.stderr or "does not exist" in proc.stderr
    _all_free(rc)
    assert rc.json("jobs", "--all") == []
    bad = rc.cli("run", "--ray", "--gpu-mem", "10G", "--", "true")
    assert bad.returncode == 2 and "--ray gives Ray whole GPUs" in bad.stderr, bad.stderr
    lonely = rc.cli("run", "--ray-cpus", "2", "--", "true")
    assert lonely.returncode == 2 and "--ray-cpus is for --ray jobs" in lonely.stderr
    assert os.environ.get("GPUCLAIM_RAY_NODE") is None


SERVICE = """
import http.server, json, os, ray
ray.init()
@ray.remote(num_cpus=0)
class Ping:
    def ping(self):
        return ray.get_runtime_context().get_node_id()
ping = Ping.remote()
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        try:
            node = ray.get(ping.ping.remote(), timeout=2)
            body, code = json.dumps({"node": node}).encode(), 200
        except Exception as exc:
            body, code = str(exc).encode(), 500
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["GPUCLAIM_PORT"])), Health).serve_forever()
"""


def test_serve_ray_keeps_a_ray_backed_service_up_and_its_cluster_with_it(
    rc: Any, ray_venv: Path, tmp_path: Path
) -> None:
    script = _script(tmp_path, SERVICE)
    job = rc.json(
        "serve", "--ray", "--ray-cpus", "1", "-n", "1", "--venv", str(ray_venv), "--name", "rsvc",
        "--health", "/", "--health-interval", "1s", "--", "python", str(script),
    )  # fmt: skip

    def health(want: str, restarts: int) -> dict[str, Any]:
        deadline = time.monotonic() + 120
        while True:
            row = _job(rc, "rsvc")
            if row["health"] == want and row["restarts"] >= restarts:
                return row
            assert time.monotonic() < deadline, (row, _log(rc, "rsvc")[-3000:])
            time.sleep(0.5)

    health("healthy", 0)
    gcs = [p for p in _ray_processes(job["id"]) if b"gcs_server" in _cmdline(p)]
    assert len(gcs) == 1, gcs
    os.kill(gcs[0], 9)  # its Ray head dies: the service stops answering, and comes back whole
    health("healthy", 1)
    assert len([p for p in _ray_processes(job["id"]) if b"gcs_server" in _cmdline(p)]) == 1
    rc.ok("kill", "rsvc")
    _until(rc, "rsvc", {"killed"}, timeout=40)
    _no_ray_left(job["id"])
    _all_free(rc)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_queued_ray_job_waits_for_a_node_with_ray_not_any_free_one(
    rc: Any, ray_venv: Path
) -> None:
    # Ray in node01's job env only: a venv relative to the job's workdir, its node's home
    (rc.testbed.home_of("node01") / ".venv").symlink_to(ray_venv)
    rc.ok("claim", "-n", "2", "--node", "node01", "--time", "10m", user="bob")
    job = rc.json(
        "run", "--ray", "--queue", "-n", "1", "--ray-cpus", "1", "-C", "~", "--venv", ".venv",
        "--name", "waits", "--", "python", "-c", "import ray; ray.init(); print('ran')",
    )  # fmt: skip
    assert job["state"] == "queued" and job["ray_nodes"] == ["node01"], job
    time.sleep(3)  # node02 is free all along: a job without Ray there must not start on it
    assert _job(rc, "waits")["state"] == "queued"
    rc.ok("release", "--all", user="bob")
    done = _until(rc, "waits", {"succeeded", "failed", "killed", "lost"})
    assert done["state"] == "succeeded" and done["ranks"][0]["node"] == "node01", done
    assert "ran" in _log(rc, "waits")
    _no_ray_left(job["id"])
