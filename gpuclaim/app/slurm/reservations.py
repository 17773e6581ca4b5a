"""gpuclaim's bookings as SLURM reservations: ``reservations.sh``, one ``scontrol create
reservation`` per booking that is not over yet, for the administrator to run once slurmctld
is up. Slurm 22.05 reserves whole nodes (or cores), not single GPUs: a booking of part of a
node's GPUs is written commented out, saying so, so nobody reserves a whole node unawares."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional

from gpuclaim.app.slurm.spec import NodeSpec
from gpuclaim.app.slurm.syntax import comment
from gpuclaim.core.booking import Booking

HEADER = """#!/bin/bash
# gpuclaim's bookings as SLURM reservations (written by 'gpuclaim export slurm').
# Run as root (or SlurmUser) once slurmctld is up; each user must exist for SLURM.
# Times are UTC: scontrol reads a time in the zone it runs in, hence TZ=UTC.
set -euo pipefail
export TZ=UTC
"""


def render_reservations(
    bookings: Sequence[Booking], nodes: Sequence[NodeSpec], now: float
) -> Optional[str]:
    """The script, or None when no booking is left to carry over."""
    by_name = {n.name: n for n in nodes}
    lines = []
    for b in sorted(bookings, key=lambda b: (b.start, b.id)):
        if b.end <= now:
            continue
        spec = by_name.get(b.node)
        if spec is None:
            lines.append(f"# {b.id}: {b.node} is not in slurm.conf (it did not answer); skipped")
            continue
        command = scontrol_line(b, spec, now)
        whole = len(b.gpus) >= len(spec.gpus)
        what = f"{b.user}: {b.node} GPU {','.join(b.labels)}"
        if b.note:
            what += f" ({comment(b.note)})"
        lines.append(f"# {b.id}, {what}")
        if whole:
            lines.append(command)
        else:
            lines.append(
                f"# only {len(b.gpus)} of {spec.slurm_name}'s {len(spec.gpus)} GPUs: a SLURM"
                " reservation holds the whole node; uncomment to reserve all of it"
            )
            lines.append(f"# {command}")
    if not lines:
        return None
    return HEADER + "\n".join(lines) + "\n"


def scontrol_line(b: Booking, spec: NodeSpec, now: float) -> str:
    start = "now" if b.start <= now else _utc(b.start)
    return (
        f"scontrol create reservation ReservationName=gpuclaim-{b.id} StartTime={start}"
        f" EndTime={_utc(b.end)} Users={b.user} Nodes={spec.slurm_name}"
    )


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts))
