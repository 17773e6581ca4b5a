"""Rich renderings of core results; pure functions of their inputs (plus the clock for 'left')."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from rich.table import Table
from rich.text import Text

from gpuclaim.core.durations import format_duration
from gpuclaim.core.model import Claim, Gpu, parse_iso
from gpuclaim.core.share_policy import format_mib
from gpuclaim.core.states import (
    FaceState,
    GpuState,
    JobState,
    face_style,
    style_of_face,
    style_of_job,
)
from gpuclaim.engine.bookings import booking_phrase
from gpuclaim.engine.cluster import ClusterView, GpuRow
from gpuclaim.engine.share_placement import shares_text

if TYPE_CHECKING:
    from gpuclaim.app.doctor import NodeHealth
    from gpuclaim.engine.service_view import ServiceRow


def status_table(
    view: ClusterView,
    now: float,
    usage: Optional[dict[str, dict[str, Any]]] = None,
    services: Optional[Mapping[str, ServiceRow]] = None,
) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NODE", "GPU", "NAME", "MEMORY", "UTIL", "STATE", "HOLDER", "LEFT", "NOTE"):
        if col == "NOTE":
            table.add_column(col, min_width=12, overflow="fold")
        else:
            table.add_column(col, no_wrap=True)
    for row in view.rows:
        table.add_row(*_status_cells(row, now, view, usage or {}, services or {}))
    return table


def services_table(rows: Iterable[ServiceRow], now: float) -> Table:
    """status's second table: each service, where it answers and how it does."""
    table = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
    for col in ("SERVICE", "USER", "NODE", "GPUS", "URL", "HEALTH", "UP", "RESTARTS"):
        table.add_column(col, no_wrap=col != "URL", overflow="fold")
    for r in rows:
        up = r.up_for(now)
        table.add_row(
            r.name,
            r.user,
            r.node,
            ",".join(map(str, r.gpus)),
            r.url,
            Text(r.health, style=_HEALTH_STYLE.get(r.health, "")),
            "" if up is None else format_duration(up),
            str(r.restarts),
        )
    return table


_HEALTH_STYLE = {"healthy": "green", "unhealthy": "yellow", "restarting": "yellow", "down": "red"}


def _status_cells(
    row: GpuRow,
    now: float,
    view: ClusterView,
    usage: dict[str, dict[str, Any]],
    services: Mapping[str, ServiceRow],
) -> list[Any]:
    g = row.gpu
    state = Text(row.state, style=style_of_face(row.state))
    if row.node in view.drains and row.state == GpuState.FREE:
        state = Text("free (drained)", style=face_style(FaceState.DRAINED))
    holder = row.claim.user if row.claim else ""
    if row.claim is not None and row.claim.preemptible and row.state == GpuState.CLAIMED:
        state = Text(f"{row.state} (preemptible)", style=style_of_face(row.state))
    left = _left(row.claim, now) if row.claim else ""
    note = ""
    if row.claim is not None:
        note = row.claim.note or (f"job {row.claim.job}" if row.claim.job else "")
        service = services.get(row.claim.id)
        if service is not None:  # its URL and health say more than "job NAME"
            note, row = f"service {service.name} {service.url} ({service.health})", _bare(row)
    if row.shares:  # who holds which part, and what is left (alice 20G · bob 40G · 20G free)
        holder = ", ".join(dict.fromkeys(c.user for c in row.shares))
        left = _left(min(row.shares, key=lambda c: c.expires), now)
        note = shares_text(row)
    if row.reason and row.state != GpuState.CLAIMED:
        note = row.reason if not note else f"{note} ({row.reason})"
    if row.claim is not None and row.state == GpuState.CLAIMED and row.reason:
        note = f"{note} ({row.reason})".strip()
    if row.booking is not None:
        booked = row.state == GpuState.RESERVED
        holder = holder or (row.booking.user if booked else "")
        left = left or (format_duration(row.booking.end - now) if booked else "")
        note = booking_note(row, now) if booked else note
        if not booked:
            note = f"{note}; {booking_note(row, now)}" if note else booking_note(row, now)
    # a service idles by design (at night): no idle mark
    keep = row.claim is None or row.claim.keep_when_idle
    use = usage.get(row.claim.id) if row.claim is not None and not keep else None
    if use and use.get("idle"):
        state = Text(f"{row.state} (idle {format_duration(use['idle_for_s'])})", style="yellow dim")
    return [
        row.node,
        row.label,
        gpu_name(g) if g else "",
        _memory(g.memory_used_mib, g.memory_total_mib) if g else "",
        "" if g is None or g.utilization_pct is None else f"{g.utilization_pct}%",
        state,
        holder,
        left,
        Text(note),
    ]


def gpu_name(g: Gpu) -> str:
    """``H100 80GB HBM3``; a MIG slice with its profile: ``H100 80GB HBM3 · 3g.40gb``."""
    name = _short_name(g.name)
    return f"{name} · {g.mig_profile}" if g.mig_profile else name


def _bare(row: GpuRow) -> GpuRow:
    """A service's row, its claim's reason (``service down``) said by its health instead."""
    return replace(row, reason="")


def booking_note(row: GpuRow, now: float) -> str:
    return booking_phrase(row.booking, now) if row.booking is not None else ""


# status's summary line: the counts after the free ones, in this order.
_SUMMARY_STATES = (
    GpuState.SHARED,
    GpuState.RESERVED,
    GpuState.CLAIMED,
    GpuState.BUSY_UNCLAIMED,
    GpuState.STALE,
    GpuState.UNREACHABLE,
)


def status_summary(view: ClusterView) -> str:
    counts: dict[str, int] = {}
    for row in view.rows:
        if row.index is not None:
            counts[row.state] = counts.get(row.state, 0) + 1
    total = sum(counts.values())
    parts = [f"{counts.get(GpuState.FREE, 0)}/{total} GPUs free"]
    for state in _SUMMARY_STATES:
        if counts.get(state):
            parts.append(f"{counts[state]} {state.value}")
    return " · ".join(parts)


def claim_lines(claim: Claim) -> list[str]:
    gpus = ",".join(claim.labels)
    until = _clock(claim.expires)
    part = ""
    if claim.shared:
        part = f" ({format_mib(claim.mem_mib)} of its {format_mib(claim.mem_total_mib)}, shared)"
    lines = [
        f"Claimed {claim.node} GPU{'s' if len(claim.gpus) > 1 else ''} {gpus}{part} for "
        f"{format_duration(round((claim.expires - claim.since) / 60) * 60)} (until {until}), "
        f"claim {claim.id}.",
        f"  export CUDA_VISIBLE_DEVICES={claim.visible}",
    ]
    if claim.shared:  # what a job of gpuclaim's is told; by hand, the same holds
        lines.append(f"  keep to {claim.mem_mib} MiB: others' work shares this GPU")
    return lines


def history_table(rows: Sequence[dict[str, Any]], by: str) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column(by.upper())
    table.add_column("GPU-HOURS", justify="right")
    table.add_column("CLAIMS", justify="right")
    table.add_column("BUSY", justify="right")
    scavenged = any(row.get("preemptible_gpu_hours") for row in rows)
    if scavenged:  # preemptible jobs' hours: idle GPUs used, given back when asked
        table.add_column("PREEMPTIBLE", justify="right")
    booked = any(row.get("booked_gpu_hours") for row in rows)
    if booked:
        table.add_column("BOOKED", justify="right")
        table.add_column("UNUSED", justify="right")
        table.add_column("NO-SHOWS", justify="right")
    for row in rows:
        busy = "" if row.get("utilization_pct") is None else f"{row['utilization_pct']:.0f}%"
        cells = [str(row[by]), f"{row['gpu_hours']:.2f}", str(row["claims"]), busy]
        if scavenged:
            cells.append(f"{row.get('preemptible_gpu_hours', 0):.2f}")
        if booked:
            cells += [
                f"{row.get('booked_gpu_hours', 0):.2f}",
                f"{row.get('unused_gpu_hours', 0):.2f}",
                str(row.get("no_shows", 0)),
            ]
        table.add_row(*cells)
    return table


def claims_history_table(rows: Sequence[dict[str, Any]]) -> Table:
    """history --claims: one claim a row, with what it was for."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("START", "END", "USER", "NODE", "GPUS", "GPU-H", "JOB", "NOTE", "CLAIM"):
        table.add_column(name, justify="right" if name in ("GPUS", "GPU-H") else "left")
    for r in rows:
        table.add_row(
            _clock(parse_iso(r["start"])),
            "held now" if r["open"] else _clock(parse_iso(r["end"])),
            r["user"],
            r["node"],
            str(r["gpus"]),
            f"{r['gpu_hours']:.2f}",
            r.get("job") or "",
            r.get("note") or "",
            r["claim_id"],
        )
    return table


def doctor_table(report: Sequence[NodeHealth]) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NODE", "SSH", "PYTHON", "TMUX", "GPUS", "DRIVER", "STORAGE", "CLOCK", "AGENT"):
        table.add_column(col, no_wrap=True)
    for h in report:
        if not h.reachable:
            table.add_row(h.node, Text(GpuState.UNREACHABLE.value, style="red"), *[""] * 7)
            continue
        skew = "" if h.clock_skew_s is None else f"{h.clock_skew_s:+.1f}s"
        table.add_row(
            h.node,
            Text(f"ok {h.seconds:.2f}s", style="green"),
            h.python or "?",
            (h.tmux or Text("missing", style="red")) if not isinstance(h.tmux, str) else h.tmux,
            f"{h.gpus} ({h.gpu_source})" if h.gpu_source else "?",
            h.driver or "",
            h.storage or "-",
            skew,
            f"{h.agent or ''} {_path_word(h.path)}".strip(),
        )
    return table


def _path_word(path: Optional[str]) -> str:
    if not path:
        return ""
    if path.startswith("warm"):
        return "(warm)"
    return "(one-shot)" if path.startswith("one-shot") else "(local)"


def jobs_table(rows: Sequence[dict[str, Any]], now: float) -> Table:
    from gpuclaim.core.model import parse_iso

    table = Table(box=None, pad_edge=False, header_style="bold")
    # squeue's REASON: why each queued job waits, when any does
    waiting = any(_waits(d) and d.get("reason") for d in rows)
    columns = ["NAME", "USER", "NODE", "GPUS", "STATE", "EXIT", "STARTED", "LEFT"]
    columns += ["REASON"] if waiting else []
    for col in (*columns, "COMMAND"):
        table.add_column(col, no_wrap=col not in ("COMMAND", "REASON"), overflow="fold")
    for d in rows:
        state = d.get("state_text") or d["state"]
        if state == JobState.QUEUED and d.get("queue_position"):
            state = f"queued #{d['queue_position']}"
        if d.get("health") and d.get("port"):  # a service: how it does, where it answers
            restarts = f", {d['restarts']} restarts" if d.get("restarts") else ""
            state = f"{state} ({d['health']}{restarts}) :{d['port']}"
        started = parse_iso(d.get("started"))
        ends = parse_iso(d.get("ends"))
        left = format_duration(ends - now) if ends and d["state"] == JobState.RUNNING else ""
        nodes = ",".join(d.get("nodes") or []) or (d.get("pinned_node") or "")
        gpus = ",".join(map(str, d.get("gpus") or [])) or str(d.get("gpus_per_node", ""))
        cells: list[Any] = [
            d["name"],
            d["user"],
            nodes,
            gpus,
            Text(state, style=style_of_job(d["state"])),
            "" if d.get("exit_code") is None else str(d["exit_code"]),
            _clock(started) if started else "",
            left,
        ]
        if waiting:
            cells.append(Text(str(d.get("reason") or "") if _waits(d) else ""))
        table.add_row(*cells, Text(" ".join(d.get("argv") or [])[:80]))
    return table


def _waits(row: dict[str, Any]) -> bool:
    """A queued job, or an array's line with queued tasks (its reason is their first's);
    an ended job's ``reason`` says how it ended, not why it waits."""
    return row["state"] == JobState.QUEUED or bool(row.get("state_text") and row.get("reason"))


def _left(claim: Optional[Claim], now: float) -> str:
    """Time left; for a job's claim, the job's own (its claim outlives it by a margin for the
    kill grace, which is not time the job has)."""
    if claim is None:
        return ""
    from gpuclaim.engine.launch import CLAIM_MARGIN_S

    end = claim.expires - (CLAIM_MARGIN_S if claim.job else 0.0)
    return format_duration(end - now)


def _clock(ts: Optional[float]) -> str:
    if ts is None:
        return "?"  # a damaged time in a record: shown as unknown, not as 1970
    when = dt.datetime.fromtimestamp(ts).astimezone()
    today = dt.datetime.now().astimezone().date()
    fmt = "%H:%M" if when.date() == today else "%a %d %b %H:%M"
    return when.strftime(fmt) + " " + (when.tzname() or "")


def _memory(used: Optional[int], total: Optional[int]) -> str:
    if total is None:
        return "n/a" if used is None else f"{used / 1024:.1f} GiB"
    return f"{(used or 0) / 1024:.1f}/{total / 1024:.0f} GiB"


def _short_name(name: str) -> str:
    return name.replace("NVIDIA ", "").replace("GeForce ", "")
