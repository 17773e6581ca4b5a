"""[serve]'s rules, in process: when a service restarts, its backoff, its health check against
a real HTTP server on loopback, and when the health check makes it restart."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

import pytest

from gpuclaim.core.service import (
    BACKOFF_FIRST_S,
    BACKOFF_MAX_S,
    STEADY_S,
    RestartPolicy,
    ServiceSpec,
    next_backoff,
    should_restart,
)
from gpuclaim.core.states import ServiceHealth
from gpuclaim.node.keep_up import HealthWatch, probe


@pytest.mark.parametrize(
    "policy, code, ours, restart",
    [
        (RestartPolicy.ON_FAILURE, 1, False, True),
        (RestartPolicy.ON_FAILURE, 137, False, True),  # killed by a signal nobody of ours sent
        (RestartPolicy.ON_FAILURE, 0, False, False),  # it ended well: it stays ended
        (RestartPolicy.ON_FAILURE, 143, True, False),  # we stopped it
        (RestartPolicy.ALWAYS, 0, False, True),
        (RestartPolicy.NEVER, 1, False, False),
    ],
)
def test_when_a_service_is_started_again(policy, code, ours, restart) -> None:
    assert should_restart(policy.value, code, ours) is restart


def test_the_backoff_doubles_to_a_minute_and_starts_over_after_a_steady_run() -> None:
    waits, wait = [], 0.0
    for _ in range(9):
        wait = next_backoff(wait, ran_s=5.0)
        waits.append(wait)
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert waits[0] == BACKOFF_FIRST_S and max(waits) == BACKOFF_MAX_S
    assert next_backoff(60.0, ran_s=STEADY_S) == BACKOFF_FIRST_S


def test_a_service_spec_reads_back_as_written() -> None:
    spec = ServiceSpec(port=8000, health_path="/health", health_interval_s=3, max_restarts=4)
    assert ServiceSpec.from_dict(spec.to_dict()) == spec
    assert spec.url("node01") == "http://node01:8000/"


class _Server:
    def __init__(self) -> None:
        self.code = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(outer.code if self.path == "/health" else 404)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd: Optional[ThreadingHTTPServer] = httpd
        self.port = int(httpd.server_address[1])
        threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    yield s
    s.close()


def test_the_health_check_asks_the_path_or_connects(server: _Server) -> None:
    spec = ServiceSpec(port=server.port, health_path="/health")
    assert probe(spec, 2.0)
    server.code = 503
    assert not probe(spec, 2.0)
    assert not probe(ServiceSpec(port=server.port, health_path="/nope"), 2.0)  # 404
    assert probe(ServiceSpec(port=server.port), 2.0)  # no path: a TCP connect
    server.close()
    assert not probe(spec, 1.0) and not probe(ServiceSpec(port=server.port), 1.0)


def test_three_failed_checks_after_an_answer_restart_it(server: _Server) -> None:
    seen: list[ServiceHealth] = []
    spec = ServiceSpec(port=server.port, health_path="/health", health_interval_s=1.0)
    watch = HealthWatch(spec, started=0.0, record=seen.append)
    assert watch.step(10.0) is None and watch.state == ServiceHealth.HEALTHY
    server.code = 500
    reasons = []
    for _ in range(3):
        watch.next_check = 0.0  # it is time to ask again
        reasons.append(watch.step(10.0))
    assert reasons[:2] == [None, None] and reasons[2] == "3 health checks failed in a row"
    assert seen == [ServiceHealth.HEALTHY, ServiceHealth.UNHEALTHY]


def test_no_first_answer_within_the_start_time_restarts_it(server: _Server) -> None:
    import time

    port = server.port
    server.close()  # nobody listens
    spec = ServiceSpec(port=port, health_path="/health", health_start_s=30.0)
    now = time.monotonic()
    young = HealthWatch(spec, started=now, record=lambda h: None)
    young.next_check = 0.0
    assert young.step(now) is None and young.state == ServiceHealth.STARTING  # still loading
    old = HealthWatch(spec, started=now - 31.0, record=lambda h: None)
    old.next_check = 0.0
    assert old.step(now) == f"no answer on port {port} within its start time"
