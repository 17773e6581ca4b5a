"""``gpuclaim board --web``: the board as a read-only web page that updates itself.

One thread asks the nodes and reads the store every refresh (as the terminal board does);
the HTTP threads only hand out its latest answer. There is no authentication, so there is
nothing to act with: GET and HEAD of the page, its script and style and ``data.json``; any
other method or path changes nothing (405 or 404). Bound to 127.0.0.1 unless told."""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, Callable, Optional

from gpuclaim.board.data import Filters, read_once
from gpuclaim.board.services import BoardServices
from gpuclaim.board.web_data import board_payload
from gpuclaim.core.errors import GpuclaimError

ASSETS = {  # path -> (file in static/, content type)
    "/": ("index.html", "text/html; charset=utf-8"),
    "/board.js": ("board.js", "text/javascript; charset=utf-8"),
    "/board.css": ("board.css", "text/css; charset=utf-8"),
}
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


class Latest:
    """The latest payload, refreshed by one thread; a failed read keeps the last good one
    and says why."""

    def __init__(self, services: BoardServices) -> None:
        self.services = services
        self._lock = threading.Lock()
        self._body = b"{}"

    def refresh(self) -> None:
        services = self.services
        try:
            data = read_once(services)
            options = services.options
            payload: dict[str, Any] = board_payload(
                data,
                services.user,
                services.config.cluster,
                options.refresh_s,
                Filters(options.users, options.nodes),
            )
        except Exception as exc:  # any: the page must say so, not go quietly stale
            with self._lock:
                last = json.loads(self._body)
            said = exc.message if isinstance(exc, GpuclaimError) else f"{type(exc).__name__}: {exc}"
            payload = {**last, "error": said}
        with self._lock:
            self._body = json.dumps(payload).encode("utf-8")

    @property
    def body(self) -> bytes:
        with self._lock:
            return self._body

    def keep_fresh(self, stop: threading.Event) -> None:
        while not stop.wait(self.services.options.refresh_s):
            self.refresh()


def make_handler(latest: Latest) -> type[BaseHTTPRequestHandler]:
    assets = {path: (_asset(name), kind) for path, (name, kind) in ASSETS.items()}

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuclaim-board"

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/data.json":
                body, kind = latest.body, "application/json"
            elif path in assets:
                body, kind = assets[path]
            else:
                self._refuse(HTTPStatus.NOT_FOUND)
                return
            self.send_response(HTTPStatus.OK)
            self._headers(kind, len(body))
            if send_body:
                self.wfile.write(body)

        def _refuse(self, status: HTTPStatus) -> None:
            body = f"{status.value} {status.phrase}: this page only shows the board\n".encode()
            self.send_response(status)
            if status == HTTPStatus.METHOD_NOT_ALLOWED:
                self.send_header("Allow", "GET, HEAD")
            self._headers("text/plain; charset=utf-8", len(body))
            self.wfile.write(body)

        def _headers(self, kind: str, length: int) -> None:
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(length))
            for key, value in HEADERS.items():
                self.send_header(key, value)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a page that asks every few seconds would fill the terminal

    def refuse(self: Any) -> None:
        self._refuse(HTTPStatus.METHOD_NOT_ALLOWED)

    for method in ("POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"):
        setattr(Handler, f"do_{method}", refuse)
    return Handler


def _asset(name: str) -> bytes:
    return resources.files("gpuclaim.board").joinpath("static", name).read_bytes()


def serve_web(
    services: BoardServices,
    host: str,
    port: int,
    ready: Optional[Callable[[str], None]] = None,
) -> None:
    """Serve until Ctrl-C; ``ready(url)`` once the first look is in and the port is open."""
    latest = Latest(services)
    latest.refresh()
    try:
        server = ThreadingHTTPServer((host, port), make_handler(latest))
    except OSError as exc:
        raise GpuclaimError(f"cannot serve the board on {host}:{port}: {exc.strerror}") from exc
    server.daemon_threads = True
    stop = threading.Event()
    refresher = threading.Thread(target=latest.keep_fresh, args=(stop,), daemon=True)
    refresher.start()
    shown = f"[{host}]" if ":" in host else host
    if ready is not None:
        ready(f"http://{shown}:{server.server_address[1]}/")
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()
