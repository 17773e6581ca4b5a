"""``gpuclaim metrics``: the cluster as Prometheus series, printed, written for
node_exporter's textfile collector, or served to a scraper."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from gpuclaim.cli.common import AppState, err, state
from gpuclaim.core.durations import format_duration, parse_duration
from gpuclaim.core.errors import GpuclaimError, UsageError

DEFAULT_MIN_INTERVAL = "15s"


def metrics(
    ctx: typer.Context,
    textfile: Optional[Path] = typer.Option(
        None,
        "--textfile",
        metavar="DIR",
        help="Write DIR/gpuclaim.prom atomically (node_exporter's textfile collector).",
    ),
    serve: Optional[str] = typer.Option(
        None, "--serve", metavar="HOST:PORT", help="Serve the series over HTTP to a scraper."
    ),
    min_interval: str = typer.Option(
        DEFAULT_MIN_INTERVAL,
        "--min-interval",
        metavar="DUR",
        help="With --serve: a scrape is answered from a look at most this old.",
    ),
) -> None:
    """Prometheus series: GPUs per state, who holds what, idle-held GPUs, GPU-hours held and
    busy, the queue, bookings, services and node answers."""
    from gpuclaim.app.metrics import exposition, take_look, write_textfile

    if textfile is not None and serve is not None:
        raise UsageError("--textfile writes one look and --serve answers scrapers: use one")
    interval = parse_duration(min_interval)
    if serve is None and min_interval != DEFAULT_MIN_INTERVAL:
        raise UsageError("--min-interval is for --serve")
    host, port = _host_port(serve) if serve is not None else ("", 0)
    st = state(ctx, looking=True)
    if serve is not None:
        _serve(st, host, port, interval)
        return
    look = take_look(st.config, st.store, st.prober, st.ops)
    if textfile is not None:
        write_textfile(textfile, look)
        return
    sys.stdout.write(exposition(look).decode("utf-8"))


def _serve(st: AppState, host: str, port: int, interval: float) -> None:
    import time

    from prometheus_client import start_http_server

    from gpuclaim.app.metrics import CachedLooks, registry_of, take_look

    looks = CachedLooks(lambda: take_look(st.config, st.store, st.prober, st.ops), interval)
    try:
        start_http_server(port, addr=host, registry=registry_of(looks))
    except OSError as exc:
        raise GpuclaimError(f"cannot serve on {host}:{port}: {exc.strerror}") from exc
    err().print(
        f"serving metrics on http://{host}:{port}/metrics (each scrape from a look at most "
        f"{format_duration(interval)} old); Ctrl-C stops",
        markup=False,
        highlight=False,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--serve wants HOST:PORT, e.g. 127.0.0.1:9101 (got {text!r})")
    return host.strip("[]") or "127.0.0.1", int(port)
