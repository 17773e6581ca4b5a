"""Booking GPUs for a future window (``reserve``): making, cancelling and settling bookings,
and what they mean for claims (kept off others' bookings; the owner gets theirs first)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

from gpuclaim.core.booking import Booking, BookingEnd
from gpuclaim.core.config import Config, NodeConfig
from gpuclaim.core.durations import format_duration
from gpuclaim.core.errors import (
    ConflictError,
    GpuclaimError,
    NeverFitsError,
    StoreError,
    UnreachableError,
    UsageError,
)
from gpuclaim.core.identity import this_host
from gpuclaim.core.inventory import label_order
from gpuclaim.core.model import ClaimedGpu, Event, EventType, NodeInventory
from gpuclaim.core.states import GpuState
from gpuclaim.core.when import format_when
from gpuclaim.engine.policy import lab_config
from gpuclaim.store import Snapshot, Store

RACE_RETRIES = 8
PAST_SLACK_S = 60.0  # "--start now" typed a moment ago is not in the past
# How far ahead a GPU row shows a booking that is not open yet (the board, status).
SHOWN_AHEAD_S = 24 * 3600.0


@dataclass(frozen=True)
class BookingRequest:
    """What ``reserve`` asks for: ``count`` GPUs (on ``node``, or exactly ``exact``) from
    ``start`` to ``end``, for ``user``."""

    user: str
    start: float
    end: float
    count: int = 1
    node: Optional[str] = None
    exact: tuple[tuple[str, tuple[str, ...]], ...] = ()  # GPU labels, as --gpu names them
    note: str = ""


def new_booking_id() -> str:
    import uuid  # here: a look that books nothing spares its import

    return "r-" + uuid.uuid4().hex[:8]


def booking_event(
    kind: EventType, b: Booking, ts: float, by: Optional[str] = None, reason: str = ""
) -> Event:
    extra: dict[str, object] = {"reservation": b.id, "gpu_hours": round(b.gpu_hours, 4)}
    if b.note:
        extra["note"] = b.note
    if b.used is not None:
        extra["used"] = b.used
    return Event(
        ts=ts,
        type=kind,
        user=b.user,
        node=b.node,
        gpus=tuple(b.indices),
        gpu_uuids=tuple(b.uuids),
        since=b.start,
        expires=b.end,
        by=by,
        reason=reason,
        extra=extra,
    )


# -- making one -----------------------------------------------------------------------------


def make_booking(
    config: Config, store: Store, req: BookingRequest, gpus_of: dict[str, list[ClaimedGpu]]
) -> Booking:
    """Book what ``req`` asks for, all or nothing. ``gpus_of``: each candidate node's GPUs
    (from a probe). Raises UsageError for a window the limits refuse, NeverFitsError for
    more GPUs than a node has, ConflictError when bookings or claims are in the way."""
    config = lab_config(config, store)
    now = store.now()
    # whole seconds: a window shown back (ISO, to the millisecond) names it exactly
    req = dataclasses.replace(req, start=float(round(req.start)), end=float(round(req.end)))
    _check_window(config, req, now)
    for attempt in range(RACE_RETRIES):
        # settled first: a no-show not yet released (nobody looked) books nothing
        snap = settle_bookings(config, store, store.snapshot())
        node, gpus = _pick(req, gpus_of, snap, now)
        _check_user_hours(config, snap, req)
        booking = Booking(
            id=new_booking_id(),
            user=req.user,
            node=node,
            gpus=tuple(gpus),
            start=req.start,
            end=req.end,
            note=req.note,
            created=now,
            host=this_host(),
        )
        try:
            store.book(booking)
        except ConflictError as exc:
            if req.exact or attempt == RACE_RETRIES - 1:
                raise _worded(store, booking, exc, now) from None
            continue  # another booking or a claim won a race for one of these GPUs
        store.append_event(booking_event(EventType.RESERVE, booking, now))
        return booking
    raise ConflictError("could not book: other bookings kept winning the race; try again")


def _check_window(config: Config, req: BookingRequest, now: float) -> None:
    limits = config.limits
    if req.start < now - PAST_SLACK_S:
        raise UsageError(
            f"--start {format_when(req.start, now)} is in the past "
            f"(it is {format_when(now, now)} now)"
        )
    if req.end <= req.start:
        raise UsageError(
            f"the booking ends ({format_when(req.end, now)}) before it starts "
            f"({format_when(req.start, now)})"
        )
    length = req.end - req.start
    if length > limits.max_reservation_s:
        raise UsageError(
            f"a booking of {format_duration(length)} is longer than this cluster's limit of "
            f"{format_duration(limits.max_reservation_s)} (max_reservation)"
        )
    if req.start - now > limits.reserve_ahead_s:
        raise UsageError(
            f"--start is {format_duration(req.start - now)} ahead; bookings may start at most "
            f"{format_duration(limits.reserve_ahead_s)} ahead (reserve_ahead)"
        )


def _check_user_hours(config: Config, snap: Snapshot, req: BookingRequest) -> None:
    limit = config.limits.max_reserved_gpu_hours
    if not limit:
        return
    booked = sum(
        len(b.gpus) * max(0.0, b.end - max(b.start, snap.now)) / 3600.0
        for b in snap.bookings
        if b.user == req.user
    )
    wanted = _wanted_count(req) * (req.end - req.start) / 3600.0
    if booked + wanted > limit + 1e-9:
        raise UsageError(
            f"{req.user} has {booked:.1f} GPU-hours booked; {wanted:.1f} more would pass the "
            f"limit of {limit:g} per user (max_reserved_gpu_hours)",
            hint="cancel a booking first: gpuclaim reserve --list",
        )


def _wanted_count(req: BookingRequest) -> int:
    return sum(len(i) for _, i in req.exact) if req.exact else req.count


def _pick(
    req: BookingRequest, gpus_of: dict[str, list[ClaimedGpu]], snap: Snapshot, now: float
) -> tuple[str, list[ClaimedGpu]]:
    if req.exact:
        node, indices = req.exact[0]
        if node not in gpus_of:
            raise UnreachableError(f"{node} could not be asked about its GPUs")
        by_index = {g.label: g for g in gpus_of[node]}
        chosen = []
        for index in map(str, indices):  # labels; an int from an API caller names a GPU too
            if index not in by_index:
                have = ", ".join(sorted(by_index, key=label_order)) or "no GPUs"
                raise NeverFitsError(f"{node} has no GPU {index} (it has {have})")
            chosen.append(by_index[index])
        found = [p for g in chosen for p in _in_the_way(node, g, req, snap, now)]
        if found:
            raise ConflictError("; ".join(dict.fromkeys(found)))
        return node, chosen
    sizes = {n: len(g) for n, g in gpus_of.items()}
    if not sizes or req.count > max(sizes.values()):
        where = f"{req.node} has" if req.node else "the largest node has"
        largest = max(sizes.values(), default=0)
        raise NeverFitsError(
            f"{req.count} GPUs can never be booked together: {where} {largest}",
            hint="a booking holds GPUs of one node",
        )
    fits = []
    reasons: list[str] = []
    problems: dict[str, None] = {}
    for order, (node, gpus) in enumerate(gpus_of.items()):
        open_ = []
        for g in gpus:
            why = _in_the_way(node, g, req, snap, now)
            problems.update(dict.fromkeys(why))
            if not why:
                open_.append(g)
        if len(open_) >= req.count:
            fits.append((len(open_), order, node, sorted(open_, key=lambda g: g.index)))
        reasons.append(f"{node} {len(open_)}/{len(gpus)} free then")
    if not fits:
        want = f"{req.count} GPU{'s' if req.count != 1 else ''}"
        listed = list(problems)
        more = f" and {len(listed) - 3} more" if len(listed) > 3 else ""
        raise ConflictError(
            f"no node has {want} free from {format_when(req.start, now)} to "
            f"{format_when(req.end, now)} ({', '.join(reasons)}): " + "; ".join(listed[:3]) + more,
            hint="see 'gpuclaim reserve --list' for the bookings",
        )
    _, _, node, free = min(fits, key=lambda f: (f[0], f[1]))  # best fit, as claims do
    return node, free[: req.count]


def _in_the_way(
    node: str, gpu: ClaimedGpu, req: BookingRequest, snap: Snapshot, now: float
) -> list[str]:
    """Why this GPU cannot be booked for the window: others' bookings, claims that last."""
    wanted = set(map(str, req.exact[0][1])) if req.exact else {gpu.label}
    found = [
        describe(b, now, set(b.labels) & wanted)
        for b in snap.bookings
        if gpu.uuid in b.uuids and b.overlaps(req.start, req.end)
    ]
    for status in snap.claims.values():
        c = status.claim
        mine = c.user == req.user
        if (
            status.state == GpuState.CLAIMED
            and not mine
            and not c.preemptible  # it yields when the booking's owner claims
            and gpu.uuid in c.uuids
            and c.expires > req.start
        ):
            found.append(
                f"{node} GPU {gpu.label} is claimed by {c.user} (claim {c.id}) until "
                f"{format_when(c.expires, now)}, after the booking starts"
            )
    return found


def describe(b: Booking, now: float, gpus: Optional[Iterable[object]] = None) -> str:
    """``node01 GPU 0,1 is reserved by alice from today 14:00 to today 17:00 (r-1a2b3c4d)``."""
    shown = b.labels if gpus is None else sorted({str(g) for g in gpus}, key=label_order)
    return (
        f"{b.node} GPU {','.join(shown)} is reserved by {b.user} from "
        f"{format_when(b.start, now)} to {format_when(b.end, now)} (reservation {b.id})"
    )


def booking_phrase(b: Booking, now: float) -> str:
    """``reserved by alice today 14:00-17:00 (r-1a2b3c4d)``, in the reader's time zone."""
    same_day = time.localtime(b.start)[:3] == time.localtime(b.end)[:3]
    ends = format_when(b.end, now)
    ends = ends.rsplit(" ", 1)[-1] if same_day else ends  # the clock alone, seconds and all
    return f"reserved by {b.user} {format_when(b.start, now)}-{ends} ({b.id})"


def _worded(store: Store, booking: Booking, exc: ConflictError, now: float) -> ConflictError:
    """The store says what won a race without times; say it with the window in local time."""
    others = [b for b in store.bookings() if b.id != booking.id]
    clashes = [
        describe(b, now, set(b.labels) & set(booking.labels))
        for b in others
        if b.shares_gpus(booking.uuids) and b.overlaps(booking.start, booking.end)
    ]
    return ConflictError("; ".join(clashes) if clashes else exc.message, hint=exc.hint)


# -- cancelling, listing ----------------------------------------------------------------------


def cancel_booking(store: Store, user: str, booking_id: str, force: bool = False) -> Booking:
    live = {b.id: b for b in store.bookings()}
    found = live.get(booking_id)
    if found is None:
        past = {e.booking.id: e for e in store.ended_bookings()}
        if booking_id in past:
            why = past[booking_id].why or "ended"
            raise GpuclaimError(f"reservation {booking_id} has already ended ({why})")
        raise GpuclaimError(f"no reservation {booking_id!r}", hint="see 'gpuclaim reserve --list'")
    booking = found
    if booking.user != user and not force:
        raise ConflictError(
            f"reservation {booking_id} belongs to {booking.user}",
            hint="cancel it with --force if you must (it is logged and announced)",
        )
    now = store.now()
    ended = store.end_booking(
        booking_id, {"ended": now, "ended_why": BookingEnd.CANCELLED.value, "by": user}
    )
    if ended is None:
        raise GpuclaimError(f"reservation {booking_id} ended meanwhile")
    by = user if user != booking.user else None
    store.append_event(booking_event(EventType.RESERVE_CANCEL, booking, now, by=by))
    return booking


@dataclass(frozen=True)
class EndedDropped:
    """What ``gc`` did to the ended bookings."""

    dropped: int = 0  # ended over keep_reservations ago: removed
    damaged: tuple[str, ...] = ()  # files that are no booking: moved to corrupt/
    left: tuple[tuple[str, str], ...] = ()  # (file, why) of files it could not read or remove


def drop_old_bookings(config: Config, store: Store) -> EndedDropped:
    """Remove the bookings that ended over ``keep_reservations`` ago (storage clock); until
    then ``reserve --list --all`` shows them."""
    found = store.drop_ended_bookings(store.now() - config.limits.keep_reservations_s)
    return EndedDropped(
        dropped=int(found["dropped"]),
        damaged=tuple(str(n) for n in found["damaged"]),
        left=tuple((str(n), str(why)) for n, why in found["left"]),
    )


# -- settling: used, over, no-show ------------------------------------------------------------


def settle_bookings(config: Config, store: Store, snap: Snapshot) -> Snapshot:
    """Bring the bookings up to date with the clock: mark one used once its owner holds its
    GPUs in the window, end one whose window is over, release one whose owner did not come
    within ``reserve_grace``. Each change is made once, by whoever looks first (the store's
    exclusive end decides), with an event. A store that refuses writes is only read."""
    grace = config.limits.reserve_grace_s
    live: list[Booking] = []
    for b in snap.bookings:
        if b.handover:  # a claim's moment of waiting for preemptible jobs: no booking's life
            if snap.now < b.end:
                live.append(b)
            else:
                with contextlib.suppress(StoreError):
                    store.drop_booking(b.id)  # its claimer went away while waiting
            continue
        holding = owner_holds(snap, b)
        try:
            if snap.now >= b.end:
                used = b.used if b.used is not None else (snap.now if holding else None)
                _end(
                    store,
                    dataclasses.replace(b, used=used),
                    BookingEnd.OVER,
                    EventType.RESERVE_END,
                    b.end,
                )
                continue
            if b.is_open(snap.now) and b.used is None:
                if holding:
                    store.update_booking(b.id, {"used": snap.now})
                    b = b.marked_used(snap.now)
                elif snap.now >= b.start + grace:
                    _end(store, b, BookingEnd.NO_SHOW, EventType.RESERVE_NOSHOW, snap.now, grace)
                    continue
        except StoreError:
            if snap.now >= b.end or (
                b.used is None and not holding and snap.now >= b.start + grace
            ):
                continue  # over all the same: nothing it books is kept from anyone
        live.append(b)
    return dataclasses.replace(snap, bookings=live)


def _end(
    store: Store,
    b: Booking,
    why: BookingEnd,
    kind: EventType,
    ts: float,
    grace: Optional[float] = None,
) -> None:
    ended = store.end_booking(b.id, {"ended": ts, "ended_why": why.value, "used": b.used})
    if ended is not None:
        event = booking_event(kind, b, ts)
        if grace is not None:
            event = dataclasses.replace(
                event,
                reason="nobody claimed its GPUs within the grace period",
                extra={**event.extra, "grace": format_duration(grace)},
            )
        store.append_event(event)


def owner_holds(snap: Snapshot, b: Booking) -> bool:
    return any(
        s.state == GpuState.CLAIMED and s.claim.user == b.user and b.shares_gpus(s.claim.uuids)
        for s in snap.claims.values()
    )


# -- what bookings mean for a claim ---------------------------------------------------------


def blocking(
    bookings: Sequence[Booking], gpu_uuid: str, user: str, start: float, end: float
) -> Optional[Booking]:
    """Another user's booking of this GPU that a hold over [start, end) would overlap."""
    hits = [
        b for b in bookings if b.user != user and gpu_uuid in b.uuids and b.overlaps(start, end)
    ]
    return min(hits, key=lambda b: b.start) if hits else None


def open_booking(bookings: Sequence[Booking], gpu_uuid: str, now: float) -> Optional[Booking]:
    return next((b for b in bookings if gpu_uuid in b.uuids and b.is_open(now)), None)


def shown_booking(bookings: Sequence[Booking], gpu_uuid: str, now: float) -> Optional[Booking]:
    """The booking a GPU row shows: the open one, else the next within a day."""
    mine = sorted(
        (b for b in bookings if gpu_uuid in b.uuids and b.end > now), key=lambda b: b.start
    )
    if mine and (mine[0].is_open(now) or mine[0].start - now <= SHOWN_AHEAD_S):
        return mine[0]
    return None


def my_open_bookings(bookings: Sequence[Booking], user: str, now: float) -> list[Booking]:
    return sorted((b for b in bookings if b.user == user and b.is_open(now)), key=lambda b: b.start)


def blocked_message(b: Booking, gpus: Iterable[object], now: float, until: float) -> str:
    text = describe(b, now, gpus)
    if b.start > now:
        text += f"; a claim until {format_when(until, now)} would overlap it"
    return text


def backfill_hint(b: Booking, now: float) -> Optional[str]:
    """A hold that ends before the booking starts is allowed: say how long that is."""
    room = b.start - now
    if room < 10:
        return None
    return f"a claim that ends before then is allowed: --time {format_duration(room - 5)} or less"


def booking_for(snap: Snapshot, booking_id: str, user: str) -> Booking:
    """One's own live booking (``claim --reservation ID``)."""
    b = next((b for b in snap.bookings if b.id == booking_id), None)
    if b is None:
        raise GpuclaimError(
            f"no live reservation {booking_id!r}", hint="see 'gpuclaim reserve --list'"
        )
    if b.user != user:
        raise ConflictError(f"reservation {booking_id} belongs to {b.user}")
    return b


def gpus_by_node(
    inventories: dict[str, NodeInventory], nodes: Sequence[NodeConfig]
) -> dict[str, list[ClaimedGpu]]:
    """Each answering node's GPUs as a booking names them; an unreachable one is left out
    (a booking needs the GPUs' UUIDs, which only the node can tell), and none answering is
    an error."""
    result: dict[str, list[ClaimedGpu]] = {}
    down = []
    for node in nodes:
        inv = inventories.get(node.name)
        if inv is None or inv.error or not inv.reachable:
            down.append(
                f"{node.name}: {(inv.error if inv else None) or GpuState.UNREACHABLE.value}"
            )
            continue
        # whole GPUs: a booking of MIG slices is not offered (yet)
        result[node.name] = [ClaimedGpu(g.uuid, g.index) for g in inv.gpus if g.mig is None]
    if not result:
        raise UnreachableError("no node could be asked about its GPUs: " + "; ".join(down))
    return result
