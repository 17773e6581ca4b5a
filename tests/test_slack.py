"""Slack notifications against a real HTTP server on loopback standing in for the webhook."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpuclaim.engine.notify import MIN_INTERVAL_S


class FakeSlack:
    """An incoming-webhook endpoint whose behaviour the test switches: ok, 500, 429, hang."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.mode = "ok"
        self.retry_after = 2
        self.refused_at = 0.0  # when the last 429 was answered
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                mode = outer.mode
                if mode == "hang":
                    time.sleep(30)  # deliberately: an answer later than any client waits
                    return
                if mode == "500":
                    self._answer(500, b"server_error")
                elif mode == "429":
                    outer.refused_at = time.monotonic()
                    self.send_response(429)
                    self.send_header("Retry-After", str(outer.retry_after))
                    self.end_headers()
                    self.wfile.write(b"rate_limited")
                elif mode == "404":
                    self._answer(404, b"no_service")
                else:
                    with outer.lock:
                        outer.received.append(json.loads(body))
                    self._answer(200, b"ok")

            def _answer(self, code: int, text: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = (
            f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/SECRETtoken42"
        )

    def texts(self) -> list[str]:
        with self.lock:
            return [m["text"] for m in self.received]

    def wait_for(self, needle: str, count: int = 1, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hits = [t for t in self.texts() if needle in t]
            if len(hits) >= count:
                return hits
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} x{count} never arrived; got {self.texts()}")

    def let_late_posts_land(self) -> None:
        """Deliberately let time pass before counting posts: a deliverer posts its next
        message MIN_INTERVAL_S after its last, so a duplicate on its way lands meanwhile."""
        time.sleep(MIN_INTERVAL_S + 0.5)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def slack():
    server = FakeSlack()
    yield server
    server.close()


def _with_slack(cluster, url: str, events=None, timeout="1s") -> None:
    text = cluster.config_path.read_text()
    extra = f'webhook_url = "{url}"\ntimeout = "{timeout}"\nmentions = {{ alice = "U0ALICE" }}\n'
    if events:
        extra += "events = " + json.dumps(events) + "\n"
    cluster.config_path.write_text(text + extra)
    cluster.config_path.chmod(0o600)


def test_job_start_and_end_arrive_once_with_fields(make_cluster, slack):
    c = make_cluster({"node01": 2}, fast=True)
    _with_slack(c, slack.url)
    c.ok("run", "--name", "ok-job", "--", "true")
    deadline = time.monotonic() + 15  # its wrapper gives the GPU back as it ends
    while any(r["state"] != "free" for r in c.status()):
        assert time.monotonic() < deadline, c.status()
        time.sleep(0.2)
    # dies at once: run itself says so (exit 1); Slack hears of it from the node
    bad = c.cli("run", "-n", "2", "--name", "bad-job", "--", "sh", "-c", "echo boom-line; exit 3")
    assert bad.returncode == 1 and "exit code 3" in bad.stderr, bad.stderr
    slack.wait_for("ok-job* succeeded".replace("*", ""), 1)
    failed = slack.wait_for("bad-job failed", 1)[0]
    assert "exit code 3" in failed
    assert "node01 GPU 0,1" in failed
    assert "GPU-h" in failed
    message = next(m for m in slack.received if "bad-job" in m["text"] and "failed" in m["text"])
    assert any("boom-line" in json.dumps(b) for b in message["blocks"])
    assert "<@U0ALICE>" in json.dumps(message["blocks"])
    slack.let_late_posts_land()
    c.ok("status")  # a later call must not send anything twice
    for name in ("ok-job", "bad-job"):
        assert len([t for t in slack.texts() if f"{name} started" in t]) == 1
        assert len([t for t in slack.texts() if name in t and "started" not in t]) == 1


@pytest.mark.parametrize("mode", ["500", "429", "hang", "refused"])
def test_a_failing_webhook_never_blocks_and_nothing_is_lost(make_cluster, slack, mode):
    c = make_cluster({"node01": 4}, fast=True)
    url = slack.url
    if mode == "refused":
        slack.close()
        url = url.replace(str(slack.server.server_address[1]), "9")  # nothing listens on 9
    _with_slack(c, url, events=["claim", "release"], timeout="1s")
    t0 = time.monotonic()
    c.ok("status")
    baseline = time.monotonic() - t0
    slack.mode = mode
    claims = []
    for _ in range(3):
        t0 = time.monotonic()
        claims.append(c.json("claim", "-n", "1"))
        took = time.monotonic() - t0
        # its normal time, plus at most the short timeout (and scheduling noise)
        assert took < baseline + 1.0 + 1.5, f"claim took {took:.1f}s with the webhook {mode}"
    assert slack.texts() == []
    if mode == "refused":
        return  # nothing to recover to; the next test covers recovery
    slack.mode = "ok"
    if mode == "429":
        # Retry-After is honoured: commands run meanwhile, and none of them posts early
        until = slack.refused_at + slack.retry_after
        while time.monotonic() < until - 0.5:
            c.ok("status")
            assert slack.texts() == [], "posted before Retry-After ran out"
        time.sleep(max(0.0, until - time.monotonic()) + 0.2)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(slack.texts()) < 3:
        c.ok("status")
    texts = slack.texts()
    assert len(texts) == 3, texts  # every message once, none duplicated, in order
    assert all("claimed node01" in t for t in texts)


def test_permanent_error_is_reported_and_not_retried_forever(make_cluster, slack):
    c = make_cluster({"node01": 2}, fast=True)
    _with_slack(c, slack.url, events=["claim"])
    slack.mode = "404"
    proc = c.cli("notify", "test")
    assert proc.returncode == 1
    assert "HTTP 404: no_service" in proc.stdout
    assert "permanent" in proc.stdout
    c.json("claim", "-n", "1")
    slack.mode = "ok"
    c.ok("status")
    assert slack.texts() == []  # the 404'd message was dropped, not retried
    doctor = c.cli("doctor")
    assert "no_service" in doctor.stdout
    proc = c.cli("notify", "test")
    assert proc.returncode == 0 and "HTTP 200: ok" in proc.stdout
    assert "gpuclaim test" in slack.texts()[-1]


def test_webhook_url_is_never_printed_logged_or_stored(make_cluster, slack, tmp_path):
    c = make_cluster({"node01": 2}, fast=True)
    _with_slack(c, slack.url, events=["claim", "release"])
    outputs = []
    for args in (
        ["status"],
        ["claim", "-n", "1"],
        ["config", "show"],
        ["config", "show", "--json"],
        ["doctor"],
        ["history"],
        ["release", "--all"],
        ["notify", "test"],
        ["run", "--name", "j1", "--", "true"],
        ["jobs", "--all"],
        ["--debug", "status"],
    ):
        proc = c.cli(*args)
        outputs.append(proc.stdout + proc.stderr)
    slack.mode = "500"
    proc = c.cli("claim", "-n", "1")
    outputs.append(proc.stdout + proc.stderr)
    secret = "SECRETtoken42"
    for text in outputs:
        assert secret not in text
    assert "<redacted>" in outputs[2]
    for root in (c.storage, c.home):
        for path in Path(root).rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path


def test_config_readable_by_others_is_warned_about(make_cluster, slack):
    c = make_cluster({"node01": 1}, fast=True)
    _with_slack(c, slack.url)
    c.config_path.chmod(0o644)
    proc = c.cli("status")
    assert "holds the Slack webhook (a secret) and others can read it" in proc.stderr
    assert "SECRETtoken42" not in proc.stderr


def test_every_force_is_logged_and_told(make_cluster, slack):
    c = make_cluster({"node01": 2}, fast=True, kill_grace="1s", heartbeat="1s")
    _with_slack(c, slack.url)
    claim = c.json("claim", "--gpu", "node01:0")
    c.ok("run", "--name", "long", "--", "sleep", "60")
    assert c.cli("release", claim["id"], user="bob").returncode == 3
    assert c.cli("kill", "long", user="bob").returncode == 1
    c.ok("release", claim["id"], "--force", user="bob")
    c.ok("kill", "long", "--force", user="bob")
    events = []
    for f in (c.storage / "events").glob("*.jsonl"):
        events += [json.loads(line) for line in f.read_text().splitlines()]
    forced = {e["type"]: e for e in events if e["type"].startswith("force-")}
    assert forced["force-release"]["by"] == "bob" and forced["force-release"]["user"] == "alice"
    assert forced["force-kill"]["by"] == "bob" and forced["force-kill"]["user"] == "alice"
    slack.wait_for("released by bob", 1)
    slack.wait_for("was killed by bob (--force)", 1)


def test_user_and_job_text_cannot_become_slack_markup(make_cluster, slack):
    """A log line `<!channel>` must not ping the whole channel, a note must not become a
    disguised link: Slack's control characters from users and jobs arrive escaped, and only
    gpuclaim's own mention of the holder stays markup."""
    c = make_cluster({"node01": 2}, fast=True)
    _with_slack(c, slack.url, events=["claim", "job_ended"])
    hostile = "<https://evil.example|click> & <!here>"
    c.ok("claim", "-n", "1", "--note", hostile)
    loud = c.cli(
        "run",
        "--name",
        "loud-job",
        "--",
        "sh",
        "-c",
        "echo 'progress <!channel> <@U0BOSS> a&b'; exit 2",
    )
    assert loud.returncode == 1, loud.stderr  # it died at once
    claim = slack.wait_for("claimed", 1)[0]
    failed = slack.wait_for("loud-job failed", 1)[0]
    messages = [
        m for m in slack.received if "claimed" in m["text"] or "loud-job failed" in m["text"]
    ]
    wire = json.dumps(messages)
    for raw in ("<!channel>", "<!here>", "<https://evil.example", "<@U0BOSS>", " a&b"):
        assert raw not in wire, raw
    assert "&lt;https://evil.example|click&gt; &amp; &lt;!here&gt;" in claim
    log_blocks = json.dumps(next(m for m in messages if "loud-job failed" in m["text"])["blocks"])
    assert "&lt;!channel&gt; &lt;@U0BOSS&gt; a&amp;b" in log_blocks
    assert "<@U0ALICE>" in json.dumps(messages)  # the holder's mention is still a mention
    assert "exit code 2" in failed


def test_a_mention_that_is_not_a_member_id_is_a_config_error(make_cluster):
    c = make_cluster({"node01": 1}, fast=True)
    text = c.config_path.read_text()
    c.config_path.write_text(text + 'mentions = { alice = "U0A|<!channel>" }\n')  # in [slack]
    proc = c.cli("status")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "'slack.mentions.alice' must be a Slack member id" in proc.stderr


def test_ssh_storage_delivers_each_message_once_from_racing_commands(testbed, make_remote, slack):
    """``storage = "ssh://…"``: delivery runs here through the store's interface (its turn,
    cursors and logs over the agent), one deliverer at a time whoever runs commands at once."""
    root = testbed.dir / "srv-store"
    root.mkdir()
    c = make_remote(
        testbed,
        storage=f"ssh://node01{root}",
        extra_toml=f'webhook_url = "{slack.url}"\ntimeout = "2s"\nevents = ["claim"]\n',
    )
    claims = [
        c.json("claim", "-n", "1", "--node", node, "--note", f"from-{user}", user=user)
        for user, node in (("alice", "node02"), ("bob", "node03"))
    ]
    with ThreadPoolExecutor(4) as pool:  # four commands deliver at the same moment
        done = list(pool.map(lambda u: c.cli("status", user=u), ["alice", "bob"] * 2))
    assert all(p.returncode == 0 for p in done), [p.stderr for p in done]
    for user in ("alice", "bob"):
        slack.wait_for(f"from-{user}", 1)
    slack.let_late_posts_land()
    c.ok("status")
    for user in ("alice", "bob"):
        assert len([t for t in slack.texts() if f"from-{user}" in t]) == 1, slack.texts()
    # the turn was given back, and the cursors live on the storage host
    assert not (root / "notify" / "turn-notify.json").exists()
    assert list((root / "notify").glob("cursor-*.json"))
    assert {cl["id"] for cl in claims} <= {c2["claim"]["id"] for c2 in c.status() if c2["claim"]}


def test_a_preemption_is_one_line_and_its_end_no_second(make_cluster, slack):
    c = make_cluster({"node01": 1}, fast=True, kill_grace="2s", heartbeat="1s")
    _with_slack(c, slack.url)
    c.config_path.write_text(c.config_path.read_text() + '\n[queue]\npreempt_grace = "2s"\n')
    # sleep dies of SIGUSR1 (its default action): it yields at once
    c.ok("run", "--preemptible", "--requeue", "--name", "scav", "--", "sleep", "300")
    slack.wait_for("scav started", 1)
    c.ok("claim", "-n", "1", user="bob")
    line = "<@U0ALICE>'s preemptible job scav yields node01 GPU 0 to bob and goes back to the queue"
    slack.wait_for(line, 1)
    slack.let_late_posts_land()
    c.ok("status")
    about = [t for t in slack.texts() if "scav" in t and "started" not in t]
    assert about == [t for t in slack.texts() if line in t], slack.texts()  # that line, once


def test_a_crash_looping_service_is_down_once_and_gives_up_once(make_cluster, slack):
    c = make_cluster({"node01": 1}, fast=True, kill_grace="2s", heartbeat="1s")
    # a webhook that answers, given the time a loaded CI machine takes (1s lost every post)
    _with_slack(c, slack.url, timeout="5s")
    c.ok("serve", "--name", "api", "--max-restarts", "3", "--", "sh", "-c", "exit 1")
    slack.wait_for("service api on node01 GPU 0 is down: it exited with status 1", 1)
    gave_up = slack.wait_for("gave up: 3 restarts within 10 minutes", 1, timeout=40)[0]
    assert "api" in gave_up and "failed" in gave_up
    slack.let_late_posts_land()
    c.ok("status")
    assert len([t for t in slack.texts() if "is down" in t]) == 1, slack.texts()
    assert len([t for t in slack.texts() if "gave up" in t]) == 1


def test_a_service_started_again_by_a_look_is_down_once_and_back_once(make_cluster, slack):
    from test_jobs import _kill_where

    c = make_cluster({"node01": 1}, fast=True, kill_grace="2s", heartbeat="1s")
    _with_slack(c, slack.url)
    server = 'exec python3 -m http.server "$GPUCLAIM_PORT" --bind 127.0.0.1'
    job = c.json("serve", "--name", "web", "--", "sh", "-c", server)
    _wait_health(c, "web", "healthy")
    # its wrapper, the server and so its tmux session die at once (as in a reboot)
    assert _kill_where({}, job["id"].encode()) >= 1
    assert _kill_where({"GPUCLAIM_JOB_ID": job["id"]}, b"http.server") == 1
    look = c.cli("status")
    assert "started alice's service web again on node01" in look.stderr, look.stderr
    down = "service web on node01 GPU 0 is down: its tmux session on node01 went away"
    slack.wait_for(down, 1)
    slack.wait_for("service web on node01 GPU 0 is back (restart 1)", 1, timeout=30)
    slack.let_late_posts_land()
    c.ok("status")
    assert len([t for t in slack.texts() if "web" in t and "is down" in t]) == 1, slack.texts()
    assert len([t for t in slack.texts() if "web" in t and "is back" in t]) == 1
    c.ok("kill", "web")


def _wait_health(c, name: str, health: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        row = next(j for j in c.json("jobs") if j["name"] == name)
        if row["health"] == health:
            return
        assert time.monotonic() < deadline, row
        time.sleep(0.3)
