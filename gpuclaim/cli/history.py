"""``gpuclaim history``: GPU-hours per user, node or day."""

from __future__ import annotations

import datetime as dt
from typing import Any, Optional

import typer

from gpuclaim.cli import completion
from gpuclaim.cli.common import err, out, print_json, state
from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import UsageError
from gpuclaim.core.identity import validate_name


def history(
    ctx: typer.Context,
    since: Optional[str] = typer.Option(
        None, "--since", help="A date (2026-11-01) or a duration back from now (7d, 24h)."
    ),
    user: Optional[str] = typer.Option(
        None, "--user", help="Only this user.", autocompletion=completion.complete_users
    ),
    by: str = typer.Option(
        "user",
        "--by",
        help="Group by user, node or day.",
        autocompletion=completion.complete_groupings,
    ),
    claims: bool = typer.Option(False, "--claims", help="List each claim instead of totals."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """GPU-hours held, from the event log (and the claims held now)."""
    from gpuclaim.app.history import GROUPINGS, booking_usage, interval_dict, summarize, with_held
    from gpuclaim.app.history_sum import read_sum, sum_path
    from gpuclaim.cli.render import claims_history_table, history_table

    if by not in GROUPINGS:
        raise UsageError(f"--by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    if user is not None:
        validate_name(user, "user name")
    st = state(ctx, looking=True)
    store = st.store
    snap = store.snapshot()
    start = _since(since, snap.now)
    # what it sums: the ends of claims (each carries its start) and of bookings, kept
    kept = read_sum(store, sum_path(store))
    intervals = with_held(kept.intervals, snap)
    events, bad = kept.booking_events(), kept.bad + kept.unfinished
    if claims:
        chosen = [
            interval_dict(iv)
            for iv in intervals
            if (user is None or iv.user == user) and (start is None or iv.end >= start)
        ]
        if as_json:
            print_json(chosen)
        else:
            out().print(claims_history_table(chosen))
        return
    usage = store.usage_summaries()
    rows = summarize(intervals, by=by, since=start, until=snap.now, user=user, usage=usage)
    if by == "user":
        _add_bookings(rows, booking_usage(events, intervals, start, snap.now), user)
    if as_json:
        print_json(rows)
    else:
        out().print(history_table(rows, by))
        total = sum(r["gpu_hours"] for r in rows)
        out().print(f"total {total:.2f} GPU-hours")
    if bad:
        err().print(f"warning: skipped {bad} damaged line(s) in {store.root / 'events'}")


def _add_bookings(
    rows: list[dict[str, Any]], booked: dict[str, dict[str, Any]], user: Optional[str]
) -> None:
    """Each user's row gets what they booked and left unused (a user who only booked gets a
    row of their own)."""
    by_user = {r["user"]: r for r in rows}
    for who, numbers in booked.items():
        if user is not None and who != user:
            continue
        row = by_user.get(who)
        if row is None:
            row = {"user": who, "gpu_hours": 0.0, "preemptible_gpu_hours": 0.0, "claims": 0}
            row.update(busy_gpu_hours=None, utilization_pct=None)
            rows.append(row)
        row.update(numbers)
    for row in rows:
        row.setdefault("booked_gpu_hours", 0.0)
        row.setdefault("unused_gpu_hours", 0.0)
        row.setdefault("no_shows", 0)


def _since(value: Optional[str], now: float) -> Optional[float]:
    if value is None:
        return None
    try:
        day = dt.date.fromisoformat(value)
    except ValueError:
        if value[:4].isdigit() and value[4:5] == "-":  # meant as a date, not a duration
            raise UsageError(
                f"--since {value!r} is not a date: use YYYY-MM-DD, e.g. 2026-11-01, or a "
                "duration back from now, e.g. 7d"
            ) from None
        return now - parse_duration(value)
    return dt.datetime.combine(day, dt.time(), tzinfo=dt.timezone.utc).timestamp()
