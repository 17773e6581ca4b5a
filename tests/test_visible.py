"""[visible]: the cluster where people already look. ``metrics`` checked by Debian's promtool
and scraped by a real Prometheus on loopback; ``--textfile`` replaced whole under a reader;
``board --web`` in Debian's headless Chromium (through its chromedriver) updating itself and
refusing to act; node lists written as ranges, on the sshd testbed."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_serve import _until

ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def _get(url: str, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method, data=b"x=1" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def background(cluster):
    """Start ``gpuclaim ARGS`` in the background as a user would; stopped at the end."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, user: str = "alice") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuclaim", *args],
            env=cluster.env(user),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cluster.home,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_metrics_pass_promtool_and_say_who_holds_what(cluster):
    cluster.ok("claim", "-n", "2", "--node", "node01")
    cluster.ok("claim", "-n", "1", "--node", "node02", user="bob")
    cluster.ok("run", "--queue", "--begin", "+2h", "--name", "later", "--", "sleep", "1")
    text = cluster.ok("metrics")
    check = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    seen = _samples(text)
    assert seen[("gpuclaim_claimed_gpus", (("node", "node01"), ("user", "alice")))] == 2
    assert seen[("gpuclaim_claimed_gpus", (("node", "node02"), ("user", "bob")))] == 1
    assert seen[("gpuclaim_gpus", (("node", "node01"), ("state", "free")))] == 2
    assert seen[("gpuclaim_gpus", (("node", "node02"), ("state", "claimed")))] == 1
    assert seen[("gpuclaim_queued_jobs", (("user", "alice"),))] == 1
    assert seen[("gpuclaim_queue_oldest_wait_seconds", ())] >= 0
    assert seen[("gpuclaim_node_up", (("node", "node01"),))] == 1
    assert seen[("gpuclaim_idle_held_gpus", (("user", "alice"),))] == 0
    assert ("gpuclaim_gpu_held_seconds_total", (("user", "alice"),)) in seen


def test_a_real_prometheus_scrapes_metrics_serve(cluster, background, tmp_path):
    port, web = _free_port(), _free_port()
    background("metrics", "--serve", f"127.0.0.1:{port}", "--min-interval", "1s")
    _until(lambda: _answers(port), 20, "metrics --serve listening")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: gpuclaim\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    prometheus = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        cluster.ok("claim", "-n", "3", "--node", "node01")
        query = urllib.parse.quote('sum(gpuclaim_claimed_gpus{user="alice"})')

        def alice_holds() -> Any:
            try:
                _, body = _get(f"http://127.0.0.1:{web}/api/v1/query?query={query}")
            except OSError:
                return None
            result = json.loads(body)["data"]["result"]
            return result and result[0]["value"][1] == "3"

        _until(alice_holds, 45, "Prometheus answering alice's 3 claimed GPUs")
        # every query of the Grafana dashboard in docs/ is one Prometheus accepts
        dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
        exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
        assert len(exprs) >= 10
        for expr in exprs:
            query = urllib.parse.quote(expr.replace("$__range", "1h"))
            status, body = _get(f"http://127.0.0.1:{web}/api/v1/query?query={query}")
            assert status == 200 and json.loads(body)["status"] == "success", (expr, body)
    finally:
        prometheus.terminate()
        prometheus.wait(15)


def test_a_scrape_is_answered_from_a_look_at_most_min_interval_old(cluster, background):
    port = _free_port()
    background("metrics", "--serve", f"127.0.0.1:{port}", "--min-interval", "3s")
    _until(lambda: _answers(port), 20, "metrics --serve listening")
    stamp = ("gpuclaim_look_timestamp_seconds", ())
    first = _samples(_get(f"http://127.0.0.1:{port}/metrics")[1].decode())[stamp]
    again = _samples(_get(f"http://127.0.0.1:{port}/metrics")[1].decode())[stamp]
    assert again == first  # the second scrape did not make the nodes answer again
    time.sleep(3.2)
    later = _samples(_get(f"http://127.0.0.1:{port}/metrics")[1].decode())[stamp]
    assert later > first


def test_the_textfile_is_replaced_whole_under_a_reader(cluster, tmp_path):
    out = tmp_path / "textfile"
    out.mkdir()
    path = out / "gpuclaim.prom"
    stop = threading.Event()
    reads: list[str] = []

    def read() -> None:
        while not stop.is_set():
            try:
                reads.append(path.read_text())
            except FileNotFoundError:
                pass

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(4):
            cluster.ok("metrics", "--textfile", str(out))
    finally:
        stop.set()
        reader.join()
    assert len(reads) > 10
    for text in reads:  # every read is a whole file: it parses and ends with its last series
        assert text.endswith("\n") and "gpuclaim_look_timestamp_seconds " in text
        _samples(text)
    assert sorted(p.name for p in out.iterdir()) == ["gpuclaim.prom"]  # no temporary left


def _browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def test_board_web_updates_itself_and_acts_on_nothing(cluster, background):
    cluster.ok("claim", "-n", "2", "--node", "node01", "--note", "bert sweep")
    port = _free_port()
    board = background("board", "--web", "--port", str(port), "--refresh", "1s")
    _until(lambda: _answers(port), 30, "board --web listening")
    browser = _browser()
    try:
        browser.get(f"http://127.0.0.1:{port}/")

        def table() -> str:
            return str(browser.execute_script("return document.getElementById('nodes').innerText"))

        _until(lambda: "alice" in table(), 15, "alice's claim on the page")
        shown = table()
        assert "node01" in shown and "node02" in shown and "bert sweep" in shown, shown
        browser.execute_script("window.__notReloaded = 42")
        cluster.ok("claim", "-n", "1", "--node", "node02", user="bob")
        t0 = time.monotonic()
        _until(lambda: "bob" in table(), 1 + 5, "bob's new claim on the page, by itself")
        print(f"bob's claim appeared on the page {time.monotonic() - t0:.1f} s after it was made")
        assert browser.execute_script("return window.__notReloaded") == 42
        browser.set_window_size(390, 844)  # a phone: readable without scrolling sideways
        inner = browser.execute_script("return window.innerWidth")
        wide = browser.execute_script("return document.documentElement.scrollWidth")
        assert wide <= inner, (wide, inner)
    finally:
        browser.quit()
    before = sorted(r["claim"]["id"] for r in cluster.status() if r["claim"])
    base = f"http://127.0.0.1:{port}"
    for method, path in (
        ("POST", "/"),
        ("POST", "/data.json"),
        ("DELETE", "/data.json"),
        ("PUT", "/release"),
    ):
        assert _get(base + path, method)[0] == 405, (method, path)
    for path in ("/release?all=1", "/claim?n=1", "/kill", "/../config.toml"):
        assert _get(base + path)[0] == 404, path
    assert sorted(r["claim"]["id"] for r in cluster.status() if r["claim"]) == before
    assert board.poll() is None


def test_board_web_flags(cluster):
    for args, words in (
        (["board", "--web", "--once"], "not with --once"),
        (["board", "--port", "9000"], "--host and --port are for --web"),
    ):
        proc = cluster.cli(*args)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_metrics_flags_are_one_line_exit_2(cluster):
    for args, words in (
        (["metrics", "--serve", "nope"], "--serve wants HOST:PORT"),
        (["metrics", "--min-interval", "5s"], "--min-interval is for --serve"),
        (["metrics", "--serve", "127.0.0.1:1", "--textfile", "/tmp"], "use one"),
    ):
        proc = cluster.cli(*args)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
    proc = cluster.cli("metrics", "--textfile", str(cluster.root / "missing"))
    assert proc.returncode == 1 and "is not a directory" in proc.stderr, proc.stderr


def test_node_ranges_in_the_config_and_in_node_flags(testbed, make_remote):
    c = make_remote(testbed, nodes=["node01", "node02"])
    text = c.config_path.read_text()
    listed = next(line for line in text.splitlines() if line.startswith("nodes = "))
    c.config_path.write_text(text.replace(listed, 'nodes = ["node[01-02]"]'))
    assert sorted({r["node"] for r in c.status()}) == ["node01", "node02"]
    only = c.json("status", "--node", "node[02]")
    assert {r["node"] for r in only} == {"node02"}
    pinned = c.cli("claim", "-n", "1", "--node", "node[01-02]")
    assert pinned.returncode == 2 and "names 2" in pinned.stderr, pinned.stderr
    c.config_path.write_text(text.replace(listed, 'nodes = ["node[01-"]'))
    broken = c.cli("status")
    lines = broken.stderr.strip().splitlines()
    assert broken.returncode != 0 and len(lines) == 1 and "'nodes'" in lines[0], broken.stderr
