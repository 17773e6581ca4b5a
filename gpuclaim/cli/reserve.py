"""``reserve``: book GPUs for a future window, list the bookings, cancel one."""

from __future__ import annotations

from typing import Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import out, print_json, quiet_option, state, waiting
from gpuclaim.core.errors import UsageError
from gpuclaim.core.identity import clean_note


def reserve(
    ctx: typer.Context,
    count: Optional[int] = typer.Option(None, "-n", "--count", min=1, help="How many GPUs."),
    gpu: Optional[str] = typer.Option(
        None, "--gpu", metavar="NODE:I,J", help="Exactly these GPUs, e.g. node01:0,2."
    ),
    node: Optional[str] = typer.Option(
        None, "--node", help="On this node.", autocompletion=completion.complete_nodes
    ),
    start: str = typer.Option(
        "now",
        "--start",
        metavar="WHEN",
        help="When it starts: +2h, 14:00, tomorrow 09:00, thu 09:00, 2026-12-03T09:00"
        " (your time zone).",
    ),
    time: Optional[str] = typer.Option(
        None, "--time", "-t", help="How long: 90m, 8h, 1-12:00:00 (or --end)."
    ),
    end: Optional[str] = typer.Option(None, "--end", metavar="WHEN", help="When it ends."),
    note: str = typer.Option("", "--note", help="What it is for, shown to everyone."),
    list_: bool = typer.Option(False, "--list", "-l", help="List the bookings."),
    all_: bool = typer.Option(False, "--all", help="With --list: ended bookings too."),
    cancel: Optional[str] = typer.Option(
        None,
        "--cancel",
        metavar="ID",
        help="Cancel a booking (your own; --force for another's).",
        autocompletion=completion.complete_reservations,
    ),
    force: bool = typer.Option(False, "--force", help="Cancel another user's booking (logged)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    quiet: bool = quiet_option(),
) -> None:
    """Book GPUs for a future window; others' claims are kept off them (exit 3 if taken)."""
    making = any(v for v in (count, gpu, node, time, end, note)) or start != "now"
    if list_ and (cancel or making):
        raise UsageError("--list shows the bookings: it takes no other options but --all, --json")
    if cancel and making:
        raise UsageError("--cancel ID takes no booking options")
    if all_ and not list_:
        raise UsageError("--all goes with --list")
    if force and not cancel:
        raise UsageError("--force goes with --cancel")
    if list_:
        _list(ctx, all_, as_json)
    elif cancel:
        _cancel(ctx, cancel, force, as_json, quiet)
    else:
        from gpuclaim.app.hostlists import one_node

        _make(ctx, count, gpu, one_node(node), start, time, end, note, as_json, quiet)


def _make(
    ctx: typer.Context,
    count: Optional[int],
    gpu: Optional[str],
    node: Optional[str],
    start: str,
    time: Optional[str],
    end: Optional[str],
    note: str,
    as_json: bool,
    quiet: bool,
) -> None:
    from gpuclaim.core.durations import format_duration, parse_duration
    from gpuclaim.core.when import format_when, parse_when
    from gpuclaim.engine.bookings import BookingRequest, gpus_by_node, make_booking
    from gpuclaim.engine.claims import parse_gpu_spec

    if count is not None and gpu:
        raise UsageError("use one of -n and --gpu")
    if (time is None) == (end is None):
        raise UsageError("say how long with --time DURATION or until when with --end WHEN")
    exact = (parse_gpu_spec(gpu),) if gpu else ()
    if exact and node and exact[0][0] != node:
        raise UsageError("--node and --gpu name different nodes")
    st = state(ctx)
    now = st.store.now()
    begins = parse_when(start, now)
    ends = begins + parse_duration(time) if time else parse_when(end or "", now, after=begins)
    cfg = st.config
    names = [exact[0][0]] if exact else [node] if node else [n.name for n in cfg.nodes]
    nodes = [cfg.node(n) for n in names]
    req = BookingRequest(
        user=st.user,
        start=begins,
        end=ends,
        count=count or 1,
        node=node,
        exact=exact,
        note=clean_note(note),
    )
    with waiting(f"asking {len(nodes)} node(s) about their GPUs", quiet):
        gpus_of = gpus_by_node(st.prober.probe(nodes), nodes)
    booking = make_booking(cfg, st.store, req, gpus_of)
    completion.remember(cfg.path, add={"reservations": [completion.booking_item(booking)]})
    if quiet:
        return
    if as_json:
        print_json(booking.to_dict())
        return
    plural = "s" if len(booking.gpus) > 1 else ""
    out().print(
        f"Booked {booking.node} GPU{plural} {','.join(booking.labels)} for "
        f"{booking.user} from {format_when(booking.start, now)} to "
        f"{format_when(booking.end, now)} ({format_duration(booking.end - booking.start)}), "
        f"reservation {booking.id}.",
        markup=False,
        highlight=False,
    )
    out().print(
        f"  In the window a plain 'gpuclaim claim' or 'run' of yours gets them (or: "
        f"gpuclaim claim --reservation {booking.id}).",
        markup=False,
    )


def _list(ctx: typer.Context, all_: bool, as_json: bool) -> None:
    from gpuclaim.core.booking import Booking
    from gpuclaim.engine.bookings import settle_bookings

    st = state(ctx, looking=True)
    snap = settle_bookings(st.config, st.store, st.store.snapshot())
    rows: list[tuple[Booking, str]] = [
        (b, "open" if b.is_open(snap.now) else "upcoming") for b in snap.bookings
    ]
    if all_:
        rows += [(e.booking, e.why or "over") for e in st.store.ended_bookings()]
    rows.sort(key=lambda r: (r[0].start, r[0].node, r[0].indices))
    live = [completion.booking_item(b) for b in snap.bookings]
    completion.remember(st.config.path, replace={"reservations": live})
    if as_json:
        print_json([dict(b.to_dict(), state=s) for b, s in rows])
        return
    if rows:
        out().print(_table(rows, snap.now))
    else:
        out().print("No bookings." if not all_ else "No bookings, past or future.")
    if all_:
        from gpuclaim.core.durations import format_duration

        kept = format_duration(st.config.limits.keep_reservations_s)
        out().print(
            f"Ended bookings are kept {kept} ('gpuclaim gc' drops older ones;"
            " [defaults] keep_reservations).",
            markup=False,
        )


def _table(rows: list[tuple[Any, str]], now: float) -> Any:
    from rich.table import Table
    from rich.text import Text

    from gpuclaim.core.durations import format_duration
    from gpuclaim.core.when import format_when

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("ID", "USER", "NODE", "GPUS", "START", "END", "STATE", "NOTE"):
        table.add_column(col, no_wrap=col != "NOTE")
    for b, st in rows:
        if st == "upcoming":
            shown = f"in {format_duration(b.start - now)}"
        elif st == "open":
            shown = "open" + (", in use" if b.used is not None else ", not claimed yet")
        else:
            shown = st
        table.add_row(
            b.id,
            b.user,
            b.node,
            ",".join(b.labels),
            format_when(b.start, now),
            format_when(b.end, now),
            shown,
            Text(b.note),
        )
    return table


def _cancel(ctx: typer.Context, booking_id: str, force: bool, as_json: bool, quiet: bool) -> None:
    from gpuclaim.core.booking import BookingEnd
    from gpuclaim.core.when import format_when
    from gpuclaim.engine.bookings import cancel_booking

    st = state(ctx)
    booking = cancel_booking(st.store, st.user, booking_id, force=force)
    completion.remember(st.config.path, remove={"reservations": [booking.id]})
    if quiet:
        return
    if as_json:
        print_json(dict(booking.to_dict(), state=BookingEnd.CANCELLED.value))
        return
    now = st.store.now()
    whose = "" if booking.user == st.user else f" (it was {booking.user}'s)"
    out().print(
        f"Cancelled reservation {booking.id}: {booking.node} GPU "
        f"{','.join(booking.labels)} {format_when(booking.start, now)} to "
        f"{format_when(booking.end, now)}{whose}.",
        markup=False,
    )
