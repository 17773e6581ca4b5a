"""Each user's recent use of the cluster, for fair share: GPU-seconds of claims and jobs,
each second counted less the older it is (halved every ``[queue] half_life``), the claims
held now included.

Ended claims are folded from the event log into a small kept sum (with a cursor per host's
log, as Slack delivery keeps), so a dispatch pass reads only what was appended since the
last one, never the whole history. Standard library only: wrappers dispatch from the nodes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuclaim.core.config import Config
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.events import event_gpu_weight
from gpuclaim.core.model import Event, EventType
from gpuclaim.core.priority import decay, decayed_gpu_seconds
from gpuclaim.core.states import GpuState
from gpuclaim.store import Snapshot, Store

STATE_FILE = "fairshare.json"  # kept next to Slack's cursors: {half_life, ref, users, cursors}
END_EVENTS = (EventType.RELEASE, EventType.FORCE_RELEASE, EventType.EXPIRE, EventType.REAP)
REMEMBERED_ENDS = 4096  # claim ids folded lately: a second end record of one is not paid twice


def use_by_user(config: Config, store: Store, snap: Snapshot) -> dict[str, float]:
    """Decayed GPU-seconds per user as of ``snap.now``: ended claims, then the held ones.
    Preemptible work is not counted (SLURM's scavenger QOS, ``UsageFactor=0``): it used GPUs
    nobody wanted and gave them back when asked."""
    half_life = config.queue.half_life_s
    now = snap.now
    kept = _fold_ended(store, half_life, now)
    use = dict(kept)
    for status in snap.claims.values():
        if status.state != GpuState.CLAIMED or status.claim.preemptible:
            continue
        c = status.claim
        held = decayed_gpu_seconds(c.gpu_weight, c.since, min(now, c.expires), now, half_life)
        use[c.user] = use.get(c.user, 0.0) + held
    return use


def _fold_ended(store: Store, half_life: float, now: float) -> dict[str, float]:
    kept = _kept(store.read_notify(name=STATE_FILE), half_life, now)
    users = {u: decay(v, now - kept.ref, half_life) for u, v in kept.users.items()}
    cursors = kept.cursors
    seen = kept.seen
    counted = set(seen)
    moved = False
    for log in store.event_logs():
        offset = cursors.get(log, 0)
        try:
            text = store.read_event_log(name=log, offset=offset)
        except (GpuclaimError, OSError):
            continue
        complete = text.rfind("\n") + 1  # a last line may still be being written
        if not complete:
            continue
        for line in text[:complete].splitlines():
            event = _event(line)
            if event is None or event.type not in END_EVENTS or event.since is None:
                continue
            if event.extra.get("preemptible"):
                continue  # scavenged: see use_by_user
            if event.claim_id in counted:
                continue
            counted.add(event.claim_id or "")
            seen.append(event.claim_id or "")
            gpu_s = decayed_gpu_seconds(
                event_gpu_weight(event), event.since, event.ts, now, half_life
            )
            users[event.user] = users.get(event.user, 0.0) + gpu_s
        cursors[log] = offset + complete
        moved = True
    if moved:
        record = {
            "half_life": half_life,
            "ref": now,
            "users": {u: v for u, v in users.items() if v >= 1.0},  # under a GPU-second: gone
            "cursors": cursors,
            "seen": seen[-REMEMBERED_ENDS:],
        }
        try:
            store.write_notify(name=STATE_FILE, data=record)
        except GpuclaimError:
            pass  # read-only storage: counted again next time, from the same cursors
    return users


@dataclass
class _Kept:
    """The sum as last kept: each user's use as of ``ref``, how far each log was read."""

    ref: float
    users: dict[str, float] = field(default_factory=dict)
    cursors: dict[str, int] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)


def _kept(state: dict[str, Any], half_life: float, now: float) -> _Kept:
    """The kept sum; none (counted again from the whole log) for another half-life or a file
    that is not what this writes (damaged, or edited by hand): never an error."""
    if state.get("half_life") != half_life:
        return _Kept(now)
    try:
        return _Kept(
            ref=float(state["ref"]),
            users={str(u): float(v) for u, v in dict(state["users"]).items()},
            cursors={str(k): int(v) for k, v in dict(state["cursors"]).items()},
            seen=[str(x) for x in list(state["seen"])],
        )
    except (KeyError, TypeError, ValueError):
        return _Kept(now)


def _event(line: str) -> Optional[Event]:
    try:
        return Event.from_dict(json.loads(line.encode("latin-1").decode("utf-8")))
    except (ValueError, KeyError, TypeError, UnicodeError):
        return None  # a damaged line counts for nothing, as in history
