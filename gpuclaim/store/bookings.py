"""Bookings (``reserve``): one file per booking, made all or nothing under the GPUs' locks.

``reservations/<id>.json`` holds a booking while it can still matter; an ended one (its window
over, cancelled, released as a no-show) moves to ``reservations/ended/<id>.json`` with why.

Two bookings of one GPU are made one at a time: each holds the locks of all its GPUs (taken in
UUID order, so two cannot wait on each other) while it reads the bookings and publishes its own.
A claim does not take those locks (it is a ``link``): a booking and a claim each write first and
then read what the other wrote — the claim looks for bookings after its link, the booking for
claims after its rename — so at least one of two racing sees the other and gives way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.booking import Booking, EndedBooking
from gpuclaim.core.errors import ConflictError
from gpuclaim.core.states import GpuState
from gpuclaim.store.claims import ClaimsPart
from gpuclaim.store.files import (
    _discard,
    _encode,
    _link_exclusive,
    _listdir_stale_safe,
    _mkdir_shared,
    _nonce,
    _read_stale_safe,
    _unlink_quiet,
    storage_error,
)
from gpuclaim.store.types import Snapshot

BOOKINGS_DIR = "reservations"
ENDED_DIR = "ended"


class BookingsPart(ClaimsPart):
    def snapshot(self) -> Snapshot:
        """The claims' snapshot, with the live bookings (placement and looks need both)."""
        snap = super().snapshot()
        snap.bookings = self.bookings()
        return snap

    def bookings(self) -> list[Booking]:
        """Every live booking (a damaged file is skipped: it books nothing)."""
        directory = self._p(BOOKINGS_DIR)
        try:
            names = _listdir_stale_safe(directory)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(self.root, exc, "read") from exc
        records = []
        for name in sorted(names):
            if not name.endswith(".json"):
                continue
            record = self._read_booking(name[: -len(".json")])
            if record is not None:
                records.append(Booking.from_record(record))
        return records

    def _read_booking(self, booking_id: str, ended: bool = False) -> Optional[dict[str, Any]]:
        parts = (BOOKINGS_DIR, ENDED_DIR) if ended else (BOOKINGS_DIR,)
        try:
            return _parsed(_read_stale_safe(self._p(*parts, f"{booking_id}.json")))
        except (OSError, *_DAMAGED):
            return None

    def book(self, booking: Booking) -> None:
        """Publish a booking unless one of another booking or a live claim of someone else
        overlaps it (a preemptible job's claim does not count: it yields when the owner
        claims); ConflictError names what is in the way."""
        self._ensure_bookings_dir()
        with self._gpu_locks(booking.uuids):
            for theirs in self.bookings():
                if booking.handover and theirs.user == booking.user and not theirs.handover:
                    continue  # the owner of a booking claiming in it: the hand-over is theirs
                if theirs.shares_gpus(booking.uuids) and theirs.overlaps(
                    booking.start, booking.end
                ):
                    raise ConflictError(f"{_which(theirs, booking)} {_booked_by(theirs)}")
            target = self._p(BOOKINGS_DIR, f"{booking.id}.json")
            self._publish(self._stage(_encode(booking.to_record())), target)
            # Written first, read second (see the module's docstring): a claim that linked
            # meanwhile is seen here, or sees this booking after its own link.
            in_way = self._claims_in_the_way(booking)
            if in_way:
                _unlink_quiet(target)
                raise ConflictError(in_way)

    def _claims_in_the_way(self, booking: Booking) -> str:
        snap = self.snapshot()
        blocking = []
        for status in snap.claims.values():
            c = status.claim
            if status.state != GpuState.CLAIMED or c.user == booking.user or c.preemptible:
                continue  # a preemptible job's claim is no obstacle: it yields when asked
            if set(c.uuids) & set(booking.uuids) and c.expires > booking.start:
                blocking.append(c)
        if not blocking:
            return ""
        return "; ".join(
            f"{c.node} GPU {','.join(map(str, sorted(set(c.indices) & set(booking.indices))))}"
            f" is claimed by {c.user} (claim {c.id}) until after the booking starts"
            for c in blocking
        )

    def update_booking(self, booking_id: str, changes: dict[str, Any]) -> Optional[Booking]:
        """Rewrite a live booking with ``changes`` (e.g. ``used``); None if it is gone."""
        with self.gpu_lock(f"booking-{booking_id}"):
            record = self._read_booking(booking_id)
            if record is None:
                return None
            record.update(changes)
            self._publish(self._stage(_encode(record)), self._p(BOOKINGS_DIR, f"{booking_id}.json"))
            return Booking.from_record(record)

    def end_booking(self, booking_id: str, changes: dict[str, Any]) -> Optional[EndedBooking]:
        """Move a live booking to ``ended/`` with ``changes`` (why, when). Exactly one of several
        callers gets the ended booking back (the one whose exclusive link made the ended file);
        the others get None, as does a booking that is not there."""
        with self.gpu_lock(f"booking-{booking_id}"):
            record = self._read_booking(booking_id)
            if record is None:
                return None
            record.update(changes)
            self._ensure_bookings_dir()
            staged = self._stage(_encode(record))
            try:
                won = _link_exclusive(
                    staged, self._p(BOOKINGS_DIR, ENDED_DIR, f"{booking_id}.json")
                )
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
            finally:
                _discard(staged)
            _unlink_quiet(self._p(BOOKINGS_DIR, f"{booking_id}.json"))
            return EndedBooking.from_record(record) if won else None

    def drop_booking(self, booking_id: str) -> bool:
        """Remove a live booking without a trace (a hand-over, done with); False if gone."""
        with self.gpu_lock(f"booking-{booking_id}"):
            try:
                os.unlink(self._p(BOOKINGS_DIR, f"{booking_id}.json"))
            except FileNotFoundError:
                return False
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
            return True

    def ended_bookings(self) -> list[EndedBooking]:
        """Every ended booking, with when and why (a damaged file is skipped)."""
        directory = self._p(BOOKINGS_DIR, ENDED_DIR)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        records = []
        for name in sorted(names):
            if name.endswith(".json"):
                record = self._read_booking(name[: -len(".json")], ended=True)
                if record is not None:
                    records.append(EndedBooking.from_record(record))
        return records

    def drop_ended_bookings(self, ended_before: float) -> dict[str, Any]:
        """Remove the ended bookings that ended before ``ended_before`` (storage clock); set a
        damaged file aside in ``corrupt/`` for a person to look at. ``dropped``: how many went;
        ``damaged``: the files set aside; ``left``: ``[file, why]`` of those it could not touch."""
        directory = self._p(BOOKINGS_DIR, ENDED_DIR)
        try:
            names = sorted(n for n in _listdir_stale_safe(directory) if n.endswith(".json"))
        except FileNotFoundError:
            names = []
        except OSError as exc:
            raise storage_error(self.root, exc, "read") from exc
        result: dict[str, Any] = {"dropped": 0, "damaged": [], "left": []}
        for name in names:
            try:
                outcome = self._drop_if_ended_before(directory / name, ended_before)
            except FileNotFoundError:
                continue  # dropped by another gc meanwhile
            except OSError as exc:
                if exc.errno != errno.ESTALE:
                    result["left"].append([name, exc.strerror or str(exc)])
                continue
            if outcome == "dropped":
                result["dropped"] += 1
            elif outcome == "damaged":
                result["damaged"].append(name)
        return result

    def _drop_if_ended_before(self, path: Path, ended_before: float) -> str:
        """``dropped``, ``kept``, or ``damaged`` (moved to ``corrupt/``, never deleted)."""
        try:
            record = _parsed(_read_stale_safe(path))
            ended = float(record.get("ended") or record["end"])
        except _DAMAGED:
            stamp = f"{int(self.now())}.{_nonce()}"
            os.rename(path, self._p("corrupt", f"booking-{path.stem}.{stamp}.json"))
            return "damaged"
        if ended >= ended_before:
            return "kept"
        os.unlink(path)
        return "dropped"

    def _ensure_bookings_dir(self) -> None:
        # Made when first needed: a store made before bookings existed has no such directory.
        for parts in ((BOOKINGS_DIR,), (BOOKINGS_DIR, ENDED_DIR)):
            try:
                _mkdir_shared(self._p(*parts))
            except OSError as exc:
                raise storage_error(self.root, exc) from exc

    @contextlib.contextmanager
    def _gpu_locks(self, uuids: list[str]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for gpu_uuid in sorted(set(uuids)):
                stack.enter_context(self.gpu_lock(f"book-{gpu_uuid}"))
            yield


# What a booking file that is there but not a booking raises when read (torn, hand-edited).
_DAMAGED = (ValueError, KeyError, TypeError, UnicodeDecodeError)


def _parsed(raw: bytes) -> dict[str, Any]:
    """A booking file's record, if it is one (only a booking that parses books anything)."""
    record = json.loads(raw.decode("utf-8"))
    Booking.from_record(record)
    return dict(record)


def _which(theirs: Booking, mine: Booking) -> str:
    shared = sorted(set(theirs.indices) & set(mine.indices))
    return f"{theirs.node} GPU {','.join(map(str, shared))} is"


def _booked_by(b: Booking) -> str:
    # No times here: the engine words the window in the user's own time zone.
    return f"booked by {b.user} (reservation {b.id})"
