"""The claim store: one directory on shared storage, correct across hosts on NFS.

Layout::

    <root>/gpus/<uuid>.claim   present = GPU held; holds the whole claim as JSON
    <root>/gpus/<uuid>.shares/<claim>.share  a share of the GPU's memory (store/shares.py)
    <root>/locks/<uuid>.lock   short-lived lock taken by whoever *removes or rewrites* a claim file
    <root>/events/<host>.jsonl append-only event log, one writer host per file
    <root>/drain/<node>        node drained (no new claims), JSON with who and why
    <root>/reservations/<id>.json  a booking of GPUs for a future window; ended/ the past ones
    <root>/jobs/<id>.json      a job's record; <id>.array an array's, <id>.ended/<i> its ended tasks
    <root>/jobs/archive/       finished job records a day old, moved in batches (.jsonl)
    <root>/policy.json         the lab's policy: limits, queue, idle (its owner's alone)
    <root>/owners/<uid>/       each account's own (0755): what its jobs run (store/owners.py)
    <root>/tmp/ trash/ corrupt/

The contract (README, "How claims stay correct"):

* Taking a GPU is ``link(tmpfile, gpus/<uuid>.claim)``: an exclusive create that is atomic on
  the file server (also NFSv2/3, where ``O_EXCL`` once was not) and that publishes a complete
  file, so a reader never sees half a claim. GPUs are taken in UUID order; on the first conflict
  the ones already taken are given back, so a multi-GPU claim is all or nothing.
* Removing or rewriting a claim file (release, extend, expiry) happens only under that GPU's
  lock file, after re-reading it: so nobody removes a claim that replaced the one they looked at.
* A claimer killed half-way leaves an *incomplete* claim: it is shown as held while its process
  may still be running, and as ``stale`` (reclaimable) once that process is dead or the claim is
  older than ``INCOMPLETE_GRACE_S``.
* Times that decide expiry come from the storage's clock (the mtime the file server stamps).
* Files are group-shared (0664, directories 2775): a lab's tool broke on ``-rw-------`` locks.

``filelock`` guards only what is host-local: appends to this host's event log.

One module per concern (``layout``, ``claims``, ``bookings``, ``records``, ``archive``,
``arrays``, ``queue``, ``owners``, ``shares``, ``usage``, ``notices``, ``drains``, ``events``,
``sweep``; files and
locks in ``files`` and ``base``), joined here into ``ClaimStore``. The interface the rest of
gpuclaim uses is ``interface.Store``, written once.
"""

from __future__ import annotations

from gpuclaim.store.archive import JobArchivePart
from gpuclaim.store.arrays import ArraysPart
from gpuclaim.store.bookings import BookingsPart
from gpuclaim.store.claims import ClaimsPart
from gpuclaim.store.drains import DrainsPart
from gpuclaim.store.events import EventLogPart
from gpuclaim.store.files import new_claim_id, storage_error
from gpuclaim.store.interface import STORE_CODEC, STORE_METHODS, Store
from gpuclaim.store.layout import LayoutPart
from gpuclaim.store.notices import NoticesPart
from gpuclaim.store.policy import PolicyPart
from gpuclaim.store.queue import QueuePart
from gpuclaim.store.records import JobRecordsPart
from gpuclaim.store.sweep import SweepPart
from gpuclaim.store.types import ClaimFile, ClaimStatus, Snapshot
from gpuclaim.store.usage import UsagePart

__all__ = [
    "STORE_CODEC",
    "STORE_METHODS",
    "ClaimFile",
    "ClaimStatus",
    "ClaimStore",
    "Snapshot",
    "Store",
    "new_claim_id",
    "storage_error",
]


class ClaimStore(
    LayoutPart,
    BookingsPart,
    ClaimsPart,
    SweepPart,
    JobRecordsPart,  # with OwnersPart, the specs it writes
    JobArchivePart,
    ArraysPart,
    QueuePart,
    UsagePart,
    NoticesPart,
    PolicyPart,
    DrainsPart,
    EventLogPart,
):
    """Claim files, locks, jobs, the queue, drains and the event log under one directory."""
