"""[serve]: services next to batch jobs, through the CLI on the sshd testbed (real tmux, a
real HTTP server as the service): a port, a health check, restarts with backoff, giving up,
a port nobody else gets, and ``kill`` for good."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from test_sweeps import _wait_stored

# A real HTTP server on $GPUCLAIM_PORT: / tells what it sees, /health answers 200 (500 while
# the file 'sick' exists), /exit makes it exit 1. Every start leaves a line in 'starts'.
SERVER = r"""
import json, os, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
here = sys.argv[1]
port = int(os.environ["GPUCLAIM_PORT"])
open(os.path.join(here, "starts"), "a").write(f"{os.getpid()}\n")
print(f"serving on {port}", flush=True)
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/exit":
            self.send_response(200); self.end_headers()
            threading.Timer(0.1, lambda: os._exit(1)).start()
            return
        if self.path == "/health":
            code = 500 if os.path.exists(os.path.join(here, "sick")) else 200
            self.send_response(code); self.end_headers(); self.wfile.write(b"ok")
            return
        body = json.dumps({"port": port, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
                           "pid": os.getpid()}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer.allow_reuse_address = True
ThreadingHTTPServer(("0.0.0.0", port), H).serve_forever()
"""


@pytest.fixture
def one_node(make_testbed, make_remote):
    tb = make_testbed(1, gpus=2)
    return make_remote(tb, kill_grace="2s", heartbeat="1s")


def _get(port: int, path: str = "/", timeout: float = 2.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.read().decode()


def _service(c, name: str, user: str = "alice") -> dict:
    return next(j for j in c.json("jobs", "--all", user=user) if j["name"] == name)


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def _serve(c, tmp: Path, name: str, *extra: str) -> dict:
    return c.json(
        "serve", "--name", name, "--health", "/health", "--health-interval", "1s",
        *extra, "--", "python3", "-c", SERVER, str(tmp),
    )  # fmt: skip


def test_a_service_answers_on_its_port_restarts_when_killed_or_sick(one_node, tmp_path):
    c = one_node
    job = _serve(c, tmp_path, "api")
    assert job["kind"] == "service" and job["state"] in ("starting", "running")
    port = job["port"]
    assert port and job["service"]["port"] == port and job["url"] == f"http://node01:{port}/"
    row = _until(lambda: (r := _service(c, "api"))["health"] == "healthy" and r, 20, "healthy")
    assert row["restarts"] == 0
    seen = json.loads(_get(port))
    assert seen["port"] == port and seen["gpus"] == ",".join(map(str, job["gpus"]))
    # status shows it: its GPU's row names it, and a table of services says how it does
    [held] = [r for r in c.status() if r["service"]]
    service = held["service"]
    assert (service["name"], service["url"], service["health"]) == ("api", row["url"], "healthy")
    assert service["restarts"] == 0 and 0 <= service["up_s"] < 60 and held["index"] in job["gpus"]
    shown = c.ok("status")
    assert "SERVICE" in shown and f"service api {row['url']} (healthy)" in shown, shown
    first_pid = seen["pid"]
    # it dies (exit 1): back on the same port, the restart counted
    _get(port, "/exit")
    t0 = time.monotonic()
    _until(lambda: _service(c, "api")["restarts"] == 1, 20, "restart counted")
    back = _until(lambda: _answer(port), 20, "back on its port")
    print(f"a service that exited was back on its port in {time.monotonic() - t0:.1f} s")
    assert back["pid"] != first_pid and time.monotonic() - t0 <= 20
    _until(lambda: _service(c, "api")["health"] == "healthy", 20, "healthy again")
    # its health check fails: restarted after 3 failed checks (1 s apart) and the backoff
    (tmp_path / "sick").touch()
    t0 = time.monotonic()
    _until(lambda: _service(c, "api")["restarts"] == 2, 3 * 1 + 2 + 10, "restarted when sick")
    print(f"a sick service was restarted after {time.monotonic() - t0:.1f} s")
    (tmp_path / "sick").unlink()
    _until(lambda: _service(c, "api")["health"] == "healthy", 20, "healthy after the restart")
    log = c.ok("logs", "api")
    assert "it exited with status 1; restart 1" in log, log
    assert "health checks failed in a row: restarting it" in log, log
    # kill ends it for good: its GPU free, its port silent
    c.ok("kill", "api")
    row = _until(lambda: (r := _service(c, "api"))["state"] == "killed" and r, 20, "killed")
    assert row["health"] is None
    assert all(r["state"] == "free" for r in c.json("status"))
    time.sleep(2)
    assert _answer(port) is None and len((tmp_path / "starts").read_text().split()) == 3


def _answer(port: int):
    try:
        return json.loads(_get(port, "/", timeout=1.0))
    except OSError:
        return None


def test_forward_reaches_a_service_from_the_laptop(one_node, tmp_path):
    import subprocess
    import sys

    c = one_node
    job = _serve(c, tmp_path, "fwd")
    _until(lambda: _answer(job["port"]), 20, "it answers on the node")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        local = s.getsockname()[1]
    printed = c.ok("forward", "fwd", "--port", str(local), "--print", user="bob")
    assert f"-L 127.0.0.1:{local}:127.0.0.1:{job['port']}" in printed and "node01" in printed
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", "forward", "fwd", "--port", str(local)],
        env=c.env(user="bob"),  # anyone's service: a shared endpoint
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        seen = _until(lambda: _answer(local), 20, "the forward answers")
        assert seen["port"] == job["port"]  # the service itself, through the tunnel
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert f"http://127.0.0.1:{local}/" in out, (out, err)
    missing = c.cli("forward", "nope")
    assert missing.returncode == 1 and "no running service 'nope'" in missing.stderr
    c.ok("kill", "fwd")


def test_a_service_that_keeps_dying_gives_up_and_frees_its_gpus(one_node, tmp_path):
    c = one_node
    c.json(
        "serve", "--name", "crashy", "--max-restarts", "2", "--",
        "python3", "-c", "import sys; sys.exit(3)",
    )  # fmt: skip
    row = _until(lambda: (r := _service(c, "crashy"))["state"] == "failed" and r, 40, "gave up")
    assert row["restarts"] == 2 and row["exit_code"] == 3
    assert row["reason"].startswith("gave up: 2 restarts within 10 minutes"), row["reason"]
    assert all(r["state"] == "free" for r in c.json("status"))


def test_a_port_is_one_services_and_a_listening_one_is_refused(one_node, tmp_path):
    c = one_node
    first = _serve(c, tmp_path, "one")
    port = first["port"]
    again = c.cli("serve", "--name", "two", "--port", str(port), "--", "sleep", "60", user="bob")
    assert again.returncode == 5, again.stderr
    assert f"port {port} on node01 is served by alice's one" in again.stderr
    with socket.socket() as other:  # a process of its own listens on a port of the node
        other.bind(("0.0.0.0", 0))
        other.listen()
        taken = other.getsockname()[1]
        proc = c.cli("serve", "--name", "three", "--port", str(taken), "--", "sleep", "60")
        assert proc.returncode == 5 and "in use by another process" in proc.stderr, proc.stderr
    assert [r["state"] for r in c.json("status")].count("claimed") == 1  # none kept a GPU
    c.ok("kill", "one")
    _wait_stored(c, lambda js: all(j["state"] != "running" for j in js), 30)


@pytest.mark.parametrize(
    "args, words",
    [
        (("--port", "0"), "--port must be from 1 to 65535"),
        (("--port", "http"), "--port wants a number or auto"),
        (("--health", " "), "--health wants a URL path"),
        (("--health-interval", "0s"), "--health-interval: duration must be positive"),
        (("--health-start", "soon"), "--health-start: "),
        (("--restart", "sometimes"), "sometimes"),
    ],
)
def test_bad_serve_flags_are_one_line_exit_2(one_node, args, words):
    proc = one_node.cli("serve", "--name", "x", *args, "--", "true")
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_rebooted_nodes_service_comes_back_at_the_next_look(one_node, tmp_path):
    c = one_node
    job = _serve(c, tmp_path, "llm")
    port = job["port"]
    _until(lambda: _service(c, "llm")["health"] == "healthy", 20, "healthy")
    before = _answer(port)
    c.testbed.reboot_node("node01")
    assert _answer(port) is None
    gpu = job["gpus"][0]
    # The first commands after the reboot, at once: bob's claim of its GPU is refused (it is
    # still alice's service's), and any command is a look that starts it again: exactly one
    # of them does, the other does not start it twice
    looks = [
        subprocess.Popen(
            [sys.executable, "-m", "gpuclaim", *argv],
            env=c.env(user),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for user, argv in (("bob", ["claim", "--gpu", f"node01:{gpu}"]), ("alice", ["status"]))
    ]
    said = [p.communicate(timeout=60) for p in looks]
    assert [p.returncode for p in looks] == [3, 0], said
    started = [err for _, err in said if "started alice's service llm again on node01" in err]
    assert len(started) == 1, said
    t0 = time.monotonic()
    back = _until(lambda: _answer(port), 30, "back on its port")
    print(f"a rebooted node's service answered {time.monotonic() - t0:.1f} s after the look")
    assert back["gpus"] == before["gpus"] and back["pid"] != before["pid"]
    row = _until(lambda: (r := _service(c, "llm"))["health"] == "healthy" and r, 20, "healthy")
    assert row["restarts"] == 1 and row["port"] == port and row["gpus"] == job["gpus"]
    claims = [r["claim"] for r in c.status() if r["claim"]]
    assert [cl["job"] for cl in claims] == [job["id"]] and claims[0]["id"] == job["ranks"][0][
        "claim_id"
    ]
    # Later looks leave it be; its log kept what it said before the reboot
    again = c.cli("status")
    assert "again" not in again.stderr, again.stderr
    time.sleep(2)
    assert len((tmp_path / "starts").read_text().split()) == 2
    log = c.ok("logs", "llm")
    assert log.count(f"serving on {port}") == 2, log  # the first run's lines are kept
    assert "gpuclaim: started again (its tmux session on node01 went away)" in log, log
    c.ok("kill", "llm")
    _until(lambda: _service(c, "llm")["state"] == "killed", 20, "killed")
    assert all(r["state"] == "free" for r in c.json("status"))


@pytest.mark.parametrize("argv", [["jobs"], ["gc"], ["run", "--", "true"], ["claim", "-n", "1"]])
def test_any_command_after_a_reboot_starts_the_service_again(one_node, tmp_path, argv):
    c = one_node
    job = _serve(c, tmp_path, "llm")
    _until(lambda: _service(c, "llm")["health"] == "healthy", 20, "healthy")
    c.testbed.reboot_node("node01")
    assert _answer(job["port"]) is None
    look = c.cli(*argv)
    assert look.returncode == 0, look.stderr
    assert "started alice's service llm again on node01" in look.stderr, look
    _until(lambda: _answer(job["port"]), 30, "back on its port")
    row = _until(lambda: (r := _service(c, "llm"))["health"] == "healthy" and r, 20, "healthy")
    assert row["restarts"] == 1


def test_serve_on_named_gpus_and_extend_its_time(one_node, tmp_path):
    c = one_node
    job = _serve(c, tmp_path, "pinned", "--gpu", "node01:1", "--time", "1h")
    assert job["gpus"] == [1] and job["time_limit_s"] == 3600
    _until(lambda: _service(c, "pinned")["health"] == "healthy", 20, "healthy")
    assert json.loads(_get(job["port"]))["gpus"] == "1"
    # the GPU it names is its own: a second service there is refused, another GPU is fine
    taken = c.cli("serve", "--name", "again", "--gpu", "node01:1", "--", "sleep", "60")
    assert taken.returncode == 3 and "node01 GPU 1 is held by alice" in taken.stderr
    [before] = [r["claim"] for r in c.status() if r["claim"]]
    said = c.ok("extend", "pinned", "--time", "2h")
    assert said.startswith("Job pinned now ends in 2h59m"), said
    assert _service(c, "pinned")["time_limit_s"] == 3 * 3600
    [after] = [r["claim"] for r in c.status() if r["claim"]]
    assert after["id"] == before["id"] and after["expires"] > before["expires"]
    over = c.cli("extend", "pinned", "--time", "40d")
    assert over.returncode == 2 and "for a service" in over.stderr, over.stderr
    c.ok("kill", "pinned")


def test_extend_reaches_a_running_jobs_wrapper(one_node):
    # A job's limit moves with its claim: the wrapper reads the new one, no timeout at the old
    c = one_node
    c.json("run", "--name", "short", "--time", "5s", "--", "sleep", "60")
    c.ok("extend", "short", "--time", "1m")
    time.sleep(9)
    row = _service(c, "short")
    assert row["state"] == "running" and row["time_limit_s"] == 65, row
    c.ok("kill", "short")


@pytest.mark.parametrize(
    "args, words",
    [
        (["--gpu", "node01:0", "-n", "2"], "names 1 GPUs, not -n 2"),
        (["--gpu", "node01:0", "--node", "node02"], "is on node01, not on --node node02"),
        (["--gpu", "node01"], "--gpu wants NODE:INDEX"),
        (["--gpu", "node01:0", "--queue"], "not with --queue"),
    ],
)
def test_bad_gpu_flags_are_one_line_exit_2(one_node, args, words):
    proc = one_node.cli("run", *args, "--", "sleep", "1")
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr
