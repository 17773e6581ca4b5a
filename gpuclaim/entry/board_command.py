"""``gpuclaim board``: the live terminal board, or one print of it (``--once``, ``--svg``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import AppState, state, waiting
from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import ExitCode, GpuclaimError, UsageError
from gpuclaim.core.identity import validate_name

if TYPE_CHECKING:
    from gpuclaim.board.data import BoardData
    from gpuclaim.board.services import BoardOptions, BoardServices

MIN_REFRESH_S = 0.2


def board(
    ctx: typer.Context,
    refresh: str = typer.Option("2s", "--refresh", help="How often to ask the nodes: 1s, 5s, 1m."),
    once: bool = typer.Option(False, "--once", help="Print the board once as text and exit."),
    svg: Optional[Path] = typer.Option(
        None, "--svg", metavar="FILE", help="Write a screenshot of the board as SVG and exit."
    ),
    size: Optional[str] = typer.Option(
        None, "--size", metavar="WxH", help="Terminal size for --once and --svg, e.g. 120x30."
    ),
    compact: bool = typer.Option(False, "--compact", help="One line per node (big clusters)."),
    user: Optional[list[str]] = typer.Option(
        None,
        "--user",
        help="Only GPUs this user holds (repeatable).",
        autocompletion=completion.complete_users,
    ),
    node: Optional[list[str]] = typer.Option(
        None,
        "--node",
        help="Only this node, or a range like node[01-02] (repeatable).",
        autocompletion=completion.complete_nodes,
    ),
    web: bool = typer.Option(
        False, "--web", help="Serve the board as a read-only web page that updates itself."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="With --web: the address to listen on (this machine only)."
    ),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="With --web: the port."),
) -> None:
    """Live board of every GPU: who holds it, for how long; claim, release, kill, attach."""
    from gpuclaim.board.services import BoardOptions

    refresh_s = parse_duration(refresh)
    if refresh_s < MIN_REFRESH_S:
        raise UsageError(f"--refresh must be at least {MIN_REFRESH_S}s")
    from gpuclaim.app.hostlists import node_names

    st = state(ctx, looking=True)
    node = node_names(node or ())
    for name in node:
        st.config.node(name)  # an unknown node is an error naming the known ones
    options = BoardOptions(
        refresh_s=refresh_s,
        compact=compact,
        users=tuple(validate_name(u, "user name") for u in user or ()),
        nodes=tuple(node or ()),
    )
    _check_web(web, once, svg, host, port)
    st.dispatch_quietly()
    services = board_services(st, options)
    if web:
        from gpuclaim.board.web import serve_web

        serve_web(services, host, port, ready=_say_serving)
        return
    width, height = _size(size)
    if once or svg is not None:
        with waiting(f"asking {len(st.config.nodes)} node(s)"):
            from gpuclaim.board.data import read_once

            data = read_once(services)
        if data.refusal:
            st.refused(data.refusal)
        if once:
            _print_once(services, data, width)
        if svg is not None:
            _write_svg(services, data, svg, width, height)
        if data.view.unreachable:
            raise typer.Exit(ExitCode.UNREACHABLE)
        return
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("the board needs a terminal; use --once to print it")
    from gpuclaim.board.app import make_app

    make_app(services).run()


def board_services(st: AppState, options: BoardOptions) -> BoardServices:
    """The board's services from the CLI's state: the same config, store, user and prober
    (so its SSH connections) as every other command."""
    from gpuclaim.board.services import BoardServices

    return BoardServices(
        config=st.config,
        store=st.store,
        user=st.user,
        prober=st.prober,
        ops=st.ops,
        options=options,
    )


def _print_once(services: BoardServices, data: BoardData, width: Optional[int]) -> None:
    from gpuclaim.board.data import Filters
    from gpuclaim.board.text import render_text

    if width is None:
        # In a pipe, rows are never cut at 80 columns, so scripts can grep whole rows.
        width = shutil.get_terminal_size((200, 24)).columns if sys.stdout.isatty() else 200
    options = services.options
    text = render_text(
        data,
        services.user,
        services.config.cluster,
        width=width,
        compact=options.compact,
        filters=Filters(options.users, options.nodes),
    )
    sys.stdout.write(text)


def _write_svg(
    services: BoardServices,
    data: BoardData,
    path: Path,
    width: Optional[int],
    height: Optional[int],
) -> None:
    from gpuclaim.board.app import export_svg
    from gpuclaim.board.data import Filters, visible_rows

    if height is None:
        options = services.options
        rows = visible_rows(data, Filters(options.users, options.nodes))
        shown = len({r.node for r in rows}) if options.compact else len(rows)
        height = max(16, min(60, shown + 10))  # header, table header, detail, footer
    title = f"gpuclaim board · {services.config.cluster}"
    svg = export_svg(services, (width or 120, height), title=title)
    try:
        path.write_text(svg, encoding="utf-8")
    except OSError as exc:
        raise GpuclaimError(f"cannot write {path}: {exc.strerror}") from exc


def _check_web(web: bool, once: bool, svg: Optional[Path], host: str, port: int) -> None:
    if web and (once or svg is not None):
        raise UsageError("--web serves the board live: not with --once or --svg")
    if not web and (host != "127.0.0.1" or port != 8080):
        raise UsageError("--host and --port are for --web")


def _say_serving(url: str) -> None:
    from gpuclaim.cli.common import err

    err().print(
        f"the board is at {url} (read-only; Ctrl-C stops). From elsewhere: ssh -L "
        f"8080:127.0.0.1:{url.rsplit(':', 1)[1].strip('/')} this-machine",
        markup=False,
        highlight=False,
    )


def _size(text: Optional[str]) -> tuple[Optional[int], Optional[int]]:
    if not text:
        return None, None
    w, sep, h = text.lower().partition("x")
    if not (w.isdigit() and (not sep or h.isdigit())):
        raise UsageError(f"--size wants WIDTHxHEIGHT, e.g. 120x30 (got {text!r})")
    width, height = int(w), int(h) if h else None
    if width < 40 or (height is not None and height < 10):
        raise UsageError("--size: at least 40x10")
    return width, height
