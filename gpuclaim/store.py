"""The claim store: one directory on shared storage, correct across hosts on NFS.

Layout::

    <root>/gpus/<uuid>.claim   present = GPU held; holds the whole claim as JSON
    <root>/locks/<uuid>.lock   short-lived lock taken by whoever *removes or rewrites* a claim file
    <root>/events/<host>.jsonl append-only event log, one writer host per file
    <root>/drain/<node>        node drained (no new claims), JSON with who and why
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
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import random
import time
import uuid as uuidlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

from gpuclaim.errors import ConflictError, StorageRefusesWrites, StoreError
from gpuclaim.identity import this_host
from gpuclaim.model import Claim, Event

FILE_MODE = 0o664
DIR_MODE = 0o2775
LAYOUT_VERSION = 1
STORE_ID_FILE = "ID"
INCOMPLETE_GRACE_S = 60.0  # an incomplete claim older than this is abandoned
LOCK_BREAK_S = 30.0  # a removal lock older than this is broken (its holder died)
LOCK_WAIT_S = 10.0
JOB_START_GRACE_S = 120.0  # a job's claim with no heartbeat yet: the launch is under way
TAKEN_ENTRY_MAX_S = 300.0  # a queue entry taken for dispatch this long ago was abandoned
LAUNCH_GRACE_S = 15.0  # ... unless the `run` that made it died here: its wrapper beats by then
_SUBDIRS = (
    "gpus",
    "locks",
    "events",
    "drain",
    "tmp",
    "trash",
    "corrupt",
    "queue",
    "jobs",
    "beats",
    "notify",
    "usage",
)
# Store methods whose arguments and results are plain JSON: the agent serves them by name
# and RemoteStore forwards them as they are.
PLAIN_METHODS = frozenset(
    {
        "create_job",
        "load_job_dict",
        "list_job_dicts",
        "update_job",
        "beat",
        "drop_beat",
        "enqueue",
        "queue_entries",
        "take_queue_entry",
        "return_queue_entry",
        "finish_queue_entry",
        "mark_notices",
        "notify_state",
        "record_usage",
        "usage_summaries",
        "writable",
        "store_id",
    }
)


@dataclass(frozen=True)
class ClaimFile:
    """One ``gpus/<uuid>.claim`` as read back: a claim, or why it could not be parsed."""

    uuid: str
    path: Path
    mtime: float
    inode: int
    claim: Optional[Claim] = None
    error: Optional[str] = None

    @property
    def unreadable(self) -> bool:
        """Present but not ours to read (or the server failed us): held by someone unknown."""
        return self.claim is None and (self.error or "").startswith("unreadable")

    def to_dict(self) -> dict[str, Any]:
        return {
            "uuid": self.uuid,
            "path": str(self.path),
            "mtime": self.mtime,
            "inode": self.inode,
            "claim": self.claim.to_dict() if self.claim else None,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClaimFile:
        return cls(
            uuid=str(d["uuid"]),
            path=Path(d["path"]),
            mtime=float(d["mtime"]),
            inode=int(d["inode"]),
            claim=Claim.from_dict(d["claim"]) if d.get("claim") else None,
            error=d.get("error"),
        )


@dataclass(frozen=True)
class ClaimStatus:
    """How the store judges one claim right now."""

    claim: Claim
    state: str  # "claimed" or "stale"
    reason: str = ""  # "expired", "incomplete", "in progress"
    present: tuple[str, ...] = ()  # uuids whose files hold this claim


@dataclass
class Snapshot:
    """Everything in the store at one moment, judged against the storage clock ``now``."""

    now: float
    files: dict[str, ClaimFile] = field(default_factory=dict)  # by GPU uuid
    claims: dict[str, ClaimStatus] = field(default_factory=dict)  # by claim id
    drains: dict[str, dict[str, Any]] = field(default_factory=dict)  # by node
    # job wrappers' heartbeats by claim id: {"mtime", "interval", "boot_id", "pid", "start"}
    beats: dict[str, dict[str, Any]] = field(default_factory=dict)

    def claim_for(self, gpu_uuid: str) -> Optional[ClaimStatus]:
        f = self.files.get(gpu_uuid)
        if f is None or f.claim is None:
            return None
        return self.claims.get(f.claim.id)

    def corrupt(self) -> list[ClaimFile]:
        """Damaged claim files (they parse as no claim): reclaimable. Unreadable ones are not."""
        return [f for f in self.files.values() if f.claim is None and not f.unreadable]

    def to_dict(self) -> dict[str, Any]:
        """The wire shape the node agent sends for storage over SSH."""
        return {
            "now": self.now,
            "files": [f.to_dict() for f in self.files.values()],
            "claims": [
                {
                    "claim": s.claim.to_dict(),
                    "state": s.state,
                    "reason": s.reason,
                    "present": list(s.present),
                }
                for s in self.claims.values()
            ],
            "drains": self.drains,
            "beats": self.beats,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Snapshot:
        files = [ClaimFile.from_dict(f) for f in d.get("files") or ()]
        claims = [
            ClaimStatus(
                Claim.from_dict(c["claim"]),
                str(c["state"]),
                str(c.get("reason") or ""),
                tuple(c.get("present") or ()),
            )
            for c in d.get("claims") or ()
        ]
        return cls(
            now=float(d["now"]),
            files={f.uuid: f for f in files},
            claims={c.claim.id: c for c in claims},
            drains=dict(d.get("drains") or {}),
            beats=dict(d.get("beats") or {}),
        )


class Store(Protocol):
    """What the core needs of a store: ``ClaimStore`` here, or ``RemoteStore`` over SSH."""

    root: Path
    refusal: Optional[StorageRefusesWrites]  # known once now() has run

    def ensure(self, create: bool = False) -> None: ...
    def now(self) -> float: ...
    def snapshot(self) -> Snapshot: ...
    def acquire(self, claim: Claim) -> None: ...
    def remove_gpu(self, gpu_uuid: str, claim_id: Optional[str], *, inode: int = 0) -> bool: ...
    def quarantine_corrupt(self, cf: ClaimFile) -> bool: ...
    def rewrite(self, old: Claim, new: Claim) -> None: ...
    def append_event(self, event: Event) -> None: ...
    def read_events(self) -> tuple[list[Event], int]: ...
    def drains(self) -> dict[str, dict[str, Any]]: ...
    def set_drain(self, node: str, info: dict[str, Any]) -> None: ...
    def clear_drain(self, node: str) -> bool: ...
    def sweep(self, max_age_s: float = 3600.0) -> int: ...
    def create_job(self, job: dict[str, Any]) -> None: ...
    def load_job_dict(self, job_id: str) -> Optional[dict[str, Any]]: ...
    def list_job_dicts(self) -> list[dict[str, Any]]: ...
    def update_job(
        self,
        job_id: str,
        changes: dict[str, Any],
        only_from: Optional[list[str]] = None,
        rank: Optional[int] = None,
        rank_changes: Optional[dict[str, Any]] = None,
    ) -> dict[str, Any]: ...
    def beat(self, claim_id: str, interval: float) -> None: ...
    def drop_beat(self, claim_id: str) -> None: ...
    def enqueue(self, job_id: str) -> str: ...
    def queue_entries(self) -> list[str]: ...
    def take_queue_entry(self, name: str) -> bool: ...
    def return_queue_entry(self, name: str) -> None: ...
    def finish_queue_entry(self, name: str) -> None: ...
    def mark_notices(self, scope: str, keys: list[str]) -> list[str]: ...
    def notify_state(self) -> dict[str, Any]: ...
    def record_usage(self, samples: dict[str, dict[str, Any]], threshold_pct: float) -> None: ...
    def usage_summaries(self, ids: Optional[list[str]] = None) -> dict[str, dict[str, Any]]: ...
    def writable(self) -> Optional[str]: ...
    def store_id(self) -> Optional[str]: ...


class ClaimStore:
    """Claim files, locks, drains and the event log under one directory."""

    def __init__(self, root: Path, host_lock_dir: Optional[Path] = None) -> None:
        self.root = Path(root)
        self.host_lock_dir = host_lock_dir
        self._clock_offset: Optional[float] = None
        self.host = this_host()
        # Set when the clock probe found that the storage refuses writes (looks say so).
        self.refusal: Optional[StorageRefusesWrites] = None

    # -- layout -------------------------------------------------------------------------------
    def ensure(self, create: bool = False) -> None:
        """Make the layout (group-shared) unless it is there: one read once it is.

        ``VERSION`` is written last, so its presence means the whole layout exists; a store
        whose layout is complete is never written to just to look at it (a read-only or full
        file system can still be read, and sshfs/NFS may answer ``mkdir`` of an existing
        directory with EPERM or EACCES instead of EEXIST).

        A store is made only inside a directory that exists (empty, as an admin makes it, or
        a store already): a typo in ``storage`` must not start a private store that splits
        the team. Only ``create`` (init, the demo, the no-config default) makes the directory.
        """
        version = self.root / "VERSION"
        try:
            if _read_stale_safe(version).strip() == str(LAYOUT_VERSION).encode():
                return
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise storage_error(self.root, exc, "read") from exc
        if not self.root.is_dir():
            if not create:
                raise StoreError(
                    f"storage {self.root} does not exist",
                    hint=(
                        "check 'storage' in your config for a typo; to start a new store, make "
                        f"the directory first: mkdir -p {self.root} && chmod 2775 {self.root}"
                    ),
                )
            try:
                self.root.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
        else:
            self._check_not_foreign()
        try:
            _mkdir_shared(self.root)
            for sub in _SUBDIRS:
                _mkdir_shared(self.root / sub)
            _mkdir_shared(self.root / "notify" / "seen")
            self._stamp_id()
            try:
                self._write_new(version, f"{LAYOUT_VERSION}\n".encode())
            except FileExistsError:
                pass  # another process made the store at the same moment
        except OSError as exc:
            raise storage_error(self.root, exc) from exc

    def _check_not_foreign(self) -> None:
        """An existing directory that holds other things is not where a store goes."""
        try:
            names = os.listdir(self.root)
        except OSError as exc:
            raise storage_error(self.root, exc, "read") from exc
        ours = {*_SUBDIRS, "VERSION", STORE_ID_FILE}
        foreign = sorted(n for n in names if n not in ours and not n.startswith("."))
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise StoreError(
                f"storage {self.root} is not a gpuclaim store and not empty (it holds {shown})",
                hint="point 'storage' at an existing store or at an empty directory",
            )

    def _stamp_id(self) -> str:
        """The store's id, made once: every node must see the same one at the same path."""
        path = self.root / STORE_ID_FILE
        staged = self._stage(f"{_nonce()}{_nonce()}\n".encode())
        try:
            _link_exclusive(staged, path)  # whole or not at all: a racing maker reads one id
        finally:
            _discard(staged)
        return path.read_text("ascii").strip()

    def store_id(self, stamp: bool = True) -> Optional[str]:
        """The id stamped when the store was made (with ``stamp``, stamped now in a store
        from before ids); None if there is none."""
        try:
            return (self.root / STORE_ID_FILE).read_text("ascii").strip() or None
        except FileNotFoundError:
            if not stamp or not (self.root / "VERSION").exists():
                return None
        except OSError:
            return None
        try:
            return self._stamp_id()
        except (OSError, StoreError):
            return None

    def _p(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    # -- clock --------------------------------------------------------------------------------
    def now(self) -> float:
        """The storage's clock: the file server stamps a new file's mtime with its own time.
        Storage that refuses writes cannot be asked: then ours stands in (only looking works
        there, and what is seen is judged against it; every write fails with its reason)."""
        if self._clock_offset is None:
            try:
                self._clock_offset = self._measure_clock_offset()
            except StorageRefusesWrites as exc:
                self.refusal = exc
                self._clock_offset = 0.0
            except StoreError:
                self._clock_offset = 0.0  # no layout to probe in; any write fails on its own
        return time.time() + self._clock_offset

    def _measure_clock_offset(self) -> float:
        """Offset of the storage clock from ours, from the tightest of a few probes. A probe
        only bounds the offset within half its round trip (a busy machine can stretch that
        to seconds), so an offset inside that bound, or within a second, counts as zero."""
        best: Optional[tuple[float, float]] = None  # (half round trip, offset)
        for _ in range(3):
            probe = self._p("tmp", f"clock-{self.host}-{os.getpid()}-{_nonce()}")
            before = time.time()
            try:
                fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
                try:
                    # a byte, not an empty file: a full disk still makes empty files
                    os.write(fd, b"\n")
                    server = os.fstat(fd).st_mtime
                finally:
                    os.close(fd)
                    _discard(probe)
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
            after = time.time()
            sample = ((after - before) / 2, server - (before + after) / 2)
            if best is None or sample[0] < best[0]:
                best = sample
            if sample[0] < 0.05:
                break
        assert best is not None
        uncertainty, offset = best
        return offset if abs(offset) > uncertainty + 1.0 else 0.0

    def writable(self) -> Optional[str]:
        """None if a claim could be written now; else why not (read-only, full...)."""
        try:
            _discard(self._stage(b"{}\n", sync=False))
        except StoreError as exc:
            return str(exc)
        return None

    # -- reading ------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Read every claim file and drain mark; never raises for a damaged file."""
        now = self.now()
        snap = Snapshot(now=now)
        gpus_dir = self._p("gpus")
        try:
            names = _listdir_stale_safe(gpus_dir)
        except FileNotFoundError:
            names = []  # a store whose layout could not be made (read-only): nothing claimed
        except OSError as exc:
            raise storage_error(self.root, exc, "read") from exc
        for name in names:
            if not name.endswith(".claim"):
                continue
            cf = self._read_claim_file(gpus_dir / name)
            if cf is not None:
                snap.files[cf.uuid] = cf
        snap.beats = self._beats()
        snap.claims = self._judge(snap.files, now, snap.beats)
        snap.drains = self.drains()
        return snap

    def _beats(self) -> dict[str, dict[str, Any]]:
        """The job wrappers' heartbeats by claim id: when (mtime, the storage clock), how
        often, and who beats (so that a node's answer can prove the wrapper gone)."""
        beats: dict[str, dict[str, Any]] = {}
        directory = self._p("beats")
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return beats
        for name in names:
            try:
                with open(directory / name, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    body = json.loads(fh.read(4096) or b"{}")
                    beat = {
                        "mtime": st.st_mtime,
                        "interval": float(body.get("interval", 10)),
                        "boot_id": body.get("boot_id"),
                        "pid": body.get("pid"),
                        "start": body.get("start"),
                    }
            except (OSError, ValueError, AttributeError, TypeError):
                continue
            beats[name] = beat
        return beats

    def _read_claim_file(self, path: Path) -> Optional[ClaimFile]:
        gpu_uuid = path.name[: -len(".claim")]
        try:
            st, raw = _again_if_stale(lambda: _read_with_stat(path))
        except FileNotFoundError:
            return None  # released while we listed
        except OSError as exc:
            # Held, by whom we cannot tell (another user's file we may not read, a file server
            # that answers EIO): never taken for damage, so never quarantined or reclaimed.
            try:
                st = os.stat(path)
            except OSError:
                return ClaimFile(gpu_uuid, path, 0.0, 0, error=f"unreadable: {exc.strerror}")
            return ClaimFile(
                gpu_uuid, path, st.st_mtime, st.st_ino, error=f"unreadable: {exc.strerror}"
            )
        try:
            claim = Claim.from_dict(json.loads(raw.decode("utf-8")))
            if gpu_uuid not in claim.uuids:
                raise ValueError("file does not belong to the claim it holds")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            return ClaimFile(gpu_uuid, path, st.st_mtime, st.st_ino, error=f"corrupt: {exc}")
        return ClaimFile(gpu_uuid, path, st.st_mtime, st.st_ino, claim=claim)

    def _judge(
        self,
        files: dict[str, ClaimFile],
        now: float,
        beats: Optional[dict[str, dict[str, Any]]] = None,
    ) -> dict[str, ClaimStatus]:
        by_id: dict[str, list[ClaimFile]] = {}
        for f in files.values():
            if f.claim is not None:
                by_id.setdefault(f.claim.id, []).append(f)
        result: dict[str, ClaimStatus] = {}
        for claim_id, parts in by_id.items():
            claim = parts[0].claim
            assert claim is not None
            present = tuple(sorted(p.uuid for p in parts))
            if len(present) < len(claim.gpus):
                if self._claimer_alive(claim) and now - claim.since < INCOMPLETE_GRACE_S:
                    result[claim_id] = ClaimStatus(claim, "claimed", "in progress", present)
                else:
                    result[claim_id] = ClaimStatus(claim, "stale", "incomplete", present)
            elif now >= claim.expires:
                result[claim_id] = ClaimStatus(claim, "stale", "expired", present)
            elif claim.job and self._job_lost(claim, (beats or {}).get(claim.id), now):
                result[claim_id] = ClaimStatus(claim, "stale", "job lost", present)
            else:
                result[claim_id] = ClaimStatus(claim, "claimed", "", present)
        return result

    def _job_lost(self, claim: Claim, beat: Optional[dict[str, Any]], now: float) -> bool:
        """A job's claim whose wrapper stopped beating (node rebooted, tmux killed) is lost;
        so is one whose wrapper never beat while the `run` that claimed it died here."""
        if beat is not None:
            return now - beat["mtime"] > 3 * beat["interval"] + 2
        if now - claim.since > JOB_START_GRACE_S:
            return True
        launcher_dead = claim.host == self.host and claim.pid > 0 and not _pid_alive(claim.pid)
        return launcher_dead and now - claim.since > LAUNCH_GRACE_S

    def _claimer_alive(self, claim: Claim) -> bool:
        """On the claimer's own host we can tell; elsewhere assume alive until the grace ends."""
        if claim.host != self.host or claim.pid <= 0:
            return True
        return _pid_alive(claim.pid)

    # -- taking -------------------------------------------------------------------------------
    def acquire(self, claim: Claim) -> None:
        """Publish ``claim`` on all its GPUs or on none; ConflictError names the holder."""
        payload = _encode(claim.to_dict())
        tmp = self._stage(payload)
        taken: list[str] = []
        try:
            for gpu_uuid in sorted(claim.uuids):
                target = self._p("gpus", f"{gpu_uuid}.claim")
                if not _link_exclusive(tmp, target):
                    holder = self._read_claim_file(target)
                    self._give_back(claim.id, taken)
                    taken = []
                    raise ConflictError(_held_message(gpu_uuid, holder))
                taken.append(gpu_uuid)
        except OSError as exc:
            self._give_back(claim.id, taken)
            raise storage_error(self.root, exc) from exc
        finally:
            _discard(tmp)

    def _give_back(self, claim_id: str, uuids: Iterable[str]) -> None:
        for gpu_uuid in uuids:
            self.remove_gpu(gpu_uuid, claim_id)

    # -- removing and rewriting ---------------------------------------------------------------
    def remove_gpu(self, gpu_uuid: str, claim_id: Optional[str], *, inode: int = 0) -> bool:
        """Remove ``gpus/<uuid>.claim`` if it still holds ``claim_id`` (or, for a corrupt file,
        is still the same inode). True if this call removed it."""
        target = self._p("gpus", f"{gpu_uuid}.claim")
        with self.gpu_lock(gpu_uuid):
            current = self._read_claim_file(target)
            if current is None:
                return False
            if claim_id is not None:
                if current.claim is None or current.claim.id != claim_id:
                    return False
            elif current.claim is not None or (inode and current.inode != inode):
                return False
            _unlink_quiet(target)
            return True

    def quarantine_corrupt(self, cf: ClaimFile) -> bool:
        """Move a damaged claim file aside (kept for a person to look at, never deleted)."""
        with self.gpu_lock(cf.uuid):
            current = self._read_claim_file(cf.path)
            if current is None or current.claim is not None or current.inode != cf.inode:
                return False
            if current.unreadable:
                return False
            dest = self._p("corrupt", f"{cf.uuid}.{int(self.now())}.{_nonce()}.claim")
            try:
                os.rename(cf.path, dest)
            except FileNotFoundError:
                return False
            return True

    def rewrite(self, old: Claim, new: Claim) -> None:
        """Replace a whole claim's files (extend): each under its lock, only if still ``old``."""
        payload = _encode(new.to_dict())
        for gpu_uuid in sorted(old.uuids):
            target = self._p("gpus", f"{gpu_uuid}.claim")
            with self.gpu_lock(gpu_uuid):
                current = self._read_claim_file(target)
                if current is None or current.claim is None or current.claim.id != old.id:
                    raise ConflictError(f"claim {old.id} changed while extending it; try again")
                tmp = self._stage(payload)
                try:
                    os.rename(tmp, target)
                except OSError as exc:
                    _discard(tmp)
                    raise storage_error(self.root, exc) from exc

    @contextlib.contextmanager
    def gpu_lock(self, gpu_uuid: str) -> Iterator[None]:
        """Exclusive lock for removing or rewriting one GPU's claim file, safe across NFS."""
        lock = self._p("locks", f"{gpu_uuid}.lock")
        body = _encode({"host": self.host, "pid": os.getpid(), "ts": time.time()})
        tmp = self._stage(body, sync=False)
        deadline = time.monotonic() + LOCK_WAIT_S
        try:
            delay = 0.002
            while not _link_exclusive(tmp, lock):
                if self._lock_abandoned(lock):
                    _break_lock(lock)
                    continue
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"lock {lock} is held for more than {LOCK_WAIT_S:.0f}s",
                        hint="if no gpuclaim is running, run 'gpuclaim gc'",
                    )
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.05)
        finally:
            _discard(tmp)
        try:
            yield
        finally:
            _unlink_quiet(lock)

    def try_lock(self, name: str) -> Optional[contextlib.AbstractContextManager[None]]:
        """The lock ``name`` if nobody holds it (or its holder died), else None at once."""
        lock = self._p("locks", f"{name}.lock")
        body = _encode({"host": self.host, "pid": os.getpid(), "ts": time.time()})
        tmp = self._stage(body, sync=False)
        try:
            taken = _link_exclusive(tmp, lock)
            if not taken and self._lock_abandoned(lock):
                _break_lock(lock)
                taken = _link_exclusive(tmp, lock)
        finally:
            _discard(tmp)
        if not taken:
            return None

        @contextlib.contextmanager
        def held() -> Iterator[None]:
            try:
                yield
            finally:
                _unlink_quiet(lock)

        return held()

    def refresh_lock(self, name: str) -> None:
        """A long-lived holder of ``try_lock(name)`` shows it is alive (locks older than
        LOCK_BREAK_S are taken for abandoned)."""
        try:
            os.utime(self._p("locks", f"{_safe(name)}.lock"))
        except OSError as exc:
            raise storage_error(self.root, exc) from exc

    def _lock_abandoned(self, lock: Path) -> bool:
        try:
            with open(lock, "rb") as fh:
                st = os.fstat(fh.fileno())
                info = json.loads(fh.read(4096).decode("utf-8") or "{}")
        except FileNotFoundError:
            return False
        except (OSError, ValueError):
            info = {}
            try:
                st = os.stat(lock)
            except OSError:
                return False
        pid = info.get("pid")
        if info.get("host") == self.host and isinstance(pid, int) and not _pid_alive(pid):
            return True
        return self.now() - st.st_mtime > LOCK_BREAK_S

    def sweep(self, max_age_s: float = 3600.0) -> int:
        """Remove what killed processes left behind: staged files and abandoned locks."""
        removed = 0
        now = self.now()
        removed += self._return_abandoned_entries(now)
        for sub in ("tmp", "locks"):
            directory = self._p(sub)
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            for name in names:
                path = directory / name
                if sub == "locks":
                    dead = name.endswith(".lock") and self._lock_abandoned(path)
                    dead = dead or ".broken." in name
                else:
                    dead = self._staged_file_abandoned(name, path, now, max_age_s)
                if dead:
                    _unlink_quiet(path)
                    removed += 1
        return removed

    def _staged_file_abandoned(self, name: str, path: Path, now: float, max_age_s: float) -> bool:
        host, _, rest = name.partition(".")
        pid_text = rest.partition(".")[0]
        if host == self.host and pid_text.isdigit() and not _pid_alive(int(pid_text)):
            return True
        try:
            return now - os.stat(path).st_mtime > max_age_s
        except FileNotFoundError:
            return False

    # -- jobs ---------------------------------------------------------------------------------
    def create_job(self, job: dict[str, Any]) -> None:
        """Publish a new job record; its id must be new."""
        tmp = self._stage(_encode(job))
        try:
            if not _link_exclusive(tmp, self._p("jobs", f"{job['id']}.json")):
                raise ConflictError(f"job {job['id']} exists already")
        finally:
            _discard(tmp)

    def load_job_dict(self, job_id: str) -> Optional[dict[str, Any]]:
        path = self._p("jobs", f"{_safe(job_id)}.json")
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            raise StoreError(f"job record {path} is damaged: {exc}") from exc
        return data if isinstance(data, dict) else None

    def list_job_dicts(self) -> list[dict[str, Any]]:
        """Every readable job record (a damaged one is skipped, not fatal)."""
        result = []
        try:
            names = os.listdir(self._p("jobs"))
        except FileNotFoundError:
            return result
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                data = json.loads(self._p("jobs", name).read_bytes().decode("utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            if isinstance(data, dict):
                result.append(data)
        return result

    def update_job(
        self,
        job_id: str,
        changes: dict[str, Any],
        only_from: Optional[list[str]] = None,
        rank: Optional[int] = None,
        rank_changes: Optional[dict[str, Any]] = None,
    ) -> dict[str, Any]:
        """Apply ``changes`` (top-level keys of the job's JSON) and ``rank_changes`` (keys of
        one rank) under the job's lock, only if its state is in ``only_from``.
        Returns {"job": the record after, "applied": bool}."""
        lock_name = f"job-{_safe(job_id)}"
        with self.gpu_lock(lock_name):
            current = self.load_job_dict(job_id)
            if current is None:
                raise StoreError(f"no job record {job_id}")
            if only_from is not None and current.get("state") not in only_from:
                return {"job": current, "applied": False}
            updated = dict(current, **changes)
            if rank is not None and rank_changes:
                updated["ranks"] = [
                    dict(r, **rank_changes) if r.get("rank") == rank else r
                    for r in updated.get("ranks") or []
                ]
            tmp = self._stage(_encode(updated))
            try:
                os.rename(tmp, self._p("jobs", f"{_safe(job_id)}.json"))
            except OSError as exc:
                _discard(tmp)
                raise storage_error(self.root, exc) from exc
            return {"job": updated, "applied": True}

    def beat(self, claim_id: str, interval: float) -> None:
        """A job wrapper's sign of life for its claim (the file's mtime is the storage clock)."""
        path = self._p("beats", _safe(claim_id))
        body = {"interval": interval, "host": self.host, **_beater()}
        self._publish(self._stage(_encode(body), sync=False), path)

    def drop_beat(self, claim_id: str) -> None:
        _unlink_quiet(self._p("beats", _safe(claim_id)))

    # -- usage: how busy claimed GPUs really are --------------------------------------------
    def record_usage(self, samples: dict[str, dict[str, Any]], threshold_pct: float) -> None:
        """Fold one utilisation sample per claim ({claim id: {"since": t, "utils": [..]}}) into
        its rolling summary, timed by the storage clock. Bounded: a few numbers per claim."""
        from gpuclaim.idle import fold_sample

        now = self.now()
        for claim_id, sample in samples.items():
            path = self._p("usage", f"{_safe(claim_id)}.json")
            with self.gpu_lock(f"usage-{_safe(claim_id)}"):
                try:
                    current = json.loads(path.read_text("utf-8"))
                except (OSError, ValueError):
                    current = None
                summary = fold_sample(
                    current, float(sample["since"]), now, list(sample["utils"]), threshold_pct
                )
                self._publish(self._stage(_encode(summary), sync=False), path)

    def usage_summaries(self, ids: Optional[list[str]] = None) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = {}
        directory = self._p("usage")
        try:
            names = [f"{i}.json" for i in ids] if ids is not None else os.listdir(directory)
        except FileNotFoundError:
            return result
        for name in names:
            try:
                data = json.loads((directory / name).read_text("utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                result[name[: -len(".json")]] = data
        return result

    def notify_state(self) -> dict[str, Any]:
        """What Slack delivery last ran into (for doctor)."""
        return self.read_notify("state.json")

    def read_notify(self, name: str) -> dict[str, Any]:
        """One of Slack delivery's small state files (cursors, state.json); {} if none."""
        try:
            data = json.loads(self._p("notify", _safe(name)).read_text("utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def write_notify(self, name: str, data: dict[str, Any]) -> None:
        """Replace one of those files whole, group-shared like every file of the store."""
        self._publish(self._stage(_encode(data), sync=False), self._p("notify", _safe(name)))

    def mark_notices(self, scope: str, keys: list[str]) -> list[str]:
        """Remember which conditions of ``scope`` hold now; return those that are new (each
        notice goes out once per episode: a GPU busy again later is news again)."""
        directory = self._p("notify", "seen")
        wanted = {f"{scope}--{_safe(k)}" for k in keys}
        new = []
        for name in sorted(wanted):
            try:
                fd = os.open(directory / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise storage_error(self.root, exc) from exc
            _fix_mode(fd)
            os.close(fd)
            new.append(name.split("--", 1)[1])
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return new
        for name in names:
            if name.startswith(f"{scope}--") and name not in wanted:
                _unlink_quiet(directory / name)
        return new

    # -- queue --------------------------------------------------------------------------------
    def enqueue(self, job_id: str) -> str:
        """Append a job to the queue; names sort in submission order (storage clock)."""
        name = f"{self.now():017.6f}-{_safe(job_id)}"
        self._publish(self._stage(b"{}\n"), self._p("queue", name))
        return name

    def queue_entries(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._p("queue")) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def take_queue_entry(self, name: str) -> bool:
        """Take an entry for dispatch; rename is atomic, so one dispatcher wins. The taken
        name says who took it, so a dispatcher killed meanwhile can be detected (sweep)."""
        taken = self._p("queue", self._taken_name(name))
        try:
            os.rename(self._p("queue", _safe(name)), taken)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(self.root, exc) from exc
        try:
            os.utime(taken)  # taken now: the age a sweep judges by
        except OSError:
            pass
        return True

    def return_queue_entry(self, name: str) -> None:
        """Put a taken entry back at its place (its name keeps its position)."""
        try:
            os.rename(self._p("queue", self._taken_name(name)), self._p("queue", _safe(name)))
        except FileNotFoundError:
            pass

    def _taken_name(self, name: str) -> str:
        return f".taken.{self.host}.{os.getpid()}.{_safe(name)}"

    def _return_abandoned_entries(self, now: float) -> int:
        """Entries taken by a dispatcher that died (here), or long ago (elsewhere), go back."""
        returned = 0
        directory = self._p("queue")
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return 0
        for taken in names:
            if not taken.startswith(".taken."):
                continue
            host, pid_text, name = taken[len(".taken.") :].split(".", 2)
            path = directory / taken
            try:
                age = now - os.stat(path).st_mtime
            except FileNotFoundError:
                continue
            dead_here = host == self.host and pid_text.isdigit() and not _pid_alive(int(pid_text))
            if dead_here or age > TAKEN_ENTRY_MAX_S:
                try:
                    os.rename(path, directory / name)
                    returned += 1
                except OSError:
                    pass
        return returned

    def finish_queue_entry(self, name: str) -> None:
        _unlink_quiet(self._p("queue", self._taken_name(name)))
        _unlink_quiet(self._p("queue", _safe(name)))

    # -- drains -------------------------------------------------------------------------------
    def drains(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = {}
        try:
            names = os.listdir(self._p("drain"))
        except FileNotFoundError:
            return result
        for name in names:
            if name.startswith("."):
                continue
            try:
                result[name] = json.loads(self._p("drain", name).read_text("utf-8"))
            except (OSError, ValueError):
                result[name] = {"user": "?", "reason": "(unreadable drain mark)"}
        return result

    def set_drain(self, node: str, info: dict[str, Any]) -> None:
        self._publish(self._stage(_encode(info)), self._p("drain", node))

    def clear_drain(self, node: str) -> bool:
        try:
            os.unlink(self._p("drain", node))
        except FileNotFoundError:
            return False
        return True

    # -- event log ----------------------------------------------------------------------------
    def append_event(self, event: Event) -> None:
        """Append one JSON line to this host's log; only this host writes that file."""
        line = (json.dumps(event.to_dict(), sort_keys=True, ensure_ascii=True) + "\n").encode()
        # One file per host and user: one writer host per file (NFS appends from two hosts
        # interleave), and the lock that orders this host's writers stays in our home.
        name = f"{self.host}-{os.getuid()}"
        path = self._p("events", f"{name}.jsonl")
        with self._host_lock(f"events-{name}"):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
                try:
                    _fix_mode(fd)
                    os.write(fd, line)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise storage_error(self.root, exc) from exc

    def read_events(self) -> tuple[list[Event], int]:
        """All events of all hosts in time order, and the number of lines that did not parse."""
        events: list[Event] = []
        bad = 0
        try:
            names = sorted(os.listdir(self._p("events")))
        except FileNotFoundError:
            return events, 0
        for name in names:
            if not name.endswith(".jsonl"):
                continue
            try:
                data = self._p("events", name).read_bytes()
            except OSError:
                bad += 1
                continue
            for raw in data.splitlines():
                if not raw.strip():
                    continue
                try:
                    events.append(Event.from_dict(json.loads(raw.decode("utf-8"))))
                except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                    bad += 1  # a torn last line after a crash, or garbage: skip, count
        events.sort(key=lambda e: e.ts)
        return events, bad

    @contextlib.contextmanager
    def _host_lock(self, name: str) -> Iterator[None]:
        lock_dir = self.host_lock_dir or Path.home() / ".cache" / "gpuclaim" / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        path = lock_dir / f"{name}.flock"
        try:
            from filelock import FileLock  # not on every node's python: fall back to fcntl
        except ImportError:
            import fcntl

            fd = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)
            return
        with FileLock(str(path), timeout=30, mode=FILE_MODE):
            yield

    # -- helpers ------------------------------------------------------------------------------
    def _stage(self, payload: bytes, sync: bool = True) -> Path:
        """A complete file in tmp/, ready to be linked or renamed into place; fsynced unless
        it is a lock or a summary that a crash may lose (claims and jobs always are)."""
        tmp = self._p("tmp", f"{self.host}.{os.getpid()}.{_nonce()}")
        try:
            self._write_new(tmp, payload, sync)
        except OSError as exc:
            _discard(tmp)
            raise storage_error(self.root, exc) from exc
        return tmp

    def _publish(self, staged: Path, path: Path) -> None:
        """Rename a staged file into place (atomic: readers see the old or the new file)."""
        try:
            os.rename(staged, path)
        except OSError as exc:
            _discard(staged)
            raise storage_error(self.root, exc) from exc

    @staticmethod
    def _write_new(path: Path, payload: bytes, sync: bool = True) -> None:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
        try:
            _fix_mode(fd)
            view = memoryview(payload)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)


# Answers that mean "you may read this storage but not write it": read-only, full, over quota,
# or not ours (root squash, a directory another user made without group write).
_REFUSED = frozenset(
    code
    for code in (errno.EROFS, errno.ENOSPC, getattr(errno, "EDQUOT", 0), errno.EACCES, errno.EPERM)
    if code
)


def storage_error(root: Path, exc: OSError, doing: str = "write") -> StoreError:
    """The one-line error for an OSError on the store, by what the answer means."""
    reason = exc.strerror or str(exc)
    if doing == "write" and exc.errno in _REFUSED:
        return StorageRefusesWrites(f"storage {root} refuses writes: {reason}")
    if exc.errno == errno.EIO:
        return StoreError(f"cannot {doing} storage {root}: {reason} (is the file server up?)")
    if exc.errno == errno.ENOENT and not root.exists():
        return StoreError(f"storage {root} does not exist")
    return StoreError(f"cannot {doing} storage {root}: {reason}")


def _again_if_stale(op: Any) -> Any:
    """NFS answers ESTALE when a file was replaced between lookup and use (rename over it):
    a fresh lookup finds the new one, so once more is the right answer, not an error."""
    try:
        return op()
    except OSError as exc:
        if exc.errno != errno.ESTALE:
            raise
        return op()


def _read_with_stat(path: Path) -> tuple[os.stat_result, bytes]:
    with open(path, "rb") as fh:
        return os.fstat(fh.fileno()), fh.read(1 << 20)


def _read_stale_safe(path: Path) -> bytes:
    return _again_if_stale(lambda: _read_with_stat(path)[1])


def _listdir_stale_safe(path: Path) -> list[str]:
    return _again_if_stale(lambda: os.listdir(path))


@functools.cache
def _beater() -> dict[str, Any]:
    """Who beats: boot id, pid and start time of this process (see gpuclaim.liveness)."""
    from gpuclaim.liveness import this_process

    return this_process()


def _safe(name: str) -> str:
    """Ids and names become file names: nothing that could climb out of the directory."""
    if not name or "/" in name or name.startswith(".") or "\0" in name:
        raise StoreError(f"invalid id {name!r}")
    return name


def new_claim_id() -> str:
    return "c-" + uuidlib.uuid4().hex[:10]


def _held_message(gpu_uuid: str, holder: Optional[ClaimFile]) -> str:
    if holder is not None and holder.claim is not None:
        c = holder.claim
        index = next((g.index for g in c.gpus if g.uuid == gpu_uuid), "?")
        return f"{c.node} GPU {index} is held by {c.user} (claim {c.id})"
    return f"GPU {gpu_uuid} was just taken by someone else"


def _link_exclusive(src: Path, dst: Path) -> bool:
    """link(2) src to dst; False if dst exists. On NFS a lost reply can make a successful link
    report EEXIST, so whether dst is now our inode decides (the classic NFS-safe lock test)."""
    try:
        os.link(src, dst)
        return True
    except FileExistsError:
        pass
    except OSError as exc:
        # SFTP (sshfs) has no "exists" answer for a hard link: a target made by another
        # host between sshfs's lookup and the link comes back as EPERM (seen: 1 racing
        # claimer in 24-82 failed so). Only a target that really is there means taken.
        if exc.errno not in (errno.EPERM, errno.EACCES) or not os.path.lexists(dst):
            raise
    try:
        return os.path.samefile(src, dst)
    except OSError:
        return False


def _break_lock(lock: Path) -> None:
    aside = lock.with_name(f"{lock.name}.broken.{_nonce()}")
    try:
        os.rename(lock, aside)
    except FileNotFoundError:
        return
    _unlink_quiet(aside)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead for our purposes (its parent has not reaped it yet).
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _encode(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, sort_keys=True, ensure_ascii=True, indent=1) + "\n").encode()


def _nonce() -> str:
    return uuidlib.uuid4().hex[:12]


def _mkdir_shared(path: Path) -> None:
    try:
        os.mkdir(path, DIR_MODE)
    except OSError:
        # EEXIST, or EPERM/EACCES from SFTP (sshfs) and root-squashed NFS for a directory that
        # is there: an existing directory is success, whatever the code says.
        if os.path.isdir(path):
            return
        raise
    with contextlib.suppress(OSError):
        os.chmod(path, DIR_MODE)  # mkdir's mode is cut by the umask


def _fix_mode(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.fchmod(fd, FILE_MODE)  # the umask would otherwise make it -rw-------/-rw-r--r--


def _discard(path: Path) -> None:
    """Remove our own staged file, if it is there: a leftover is swept later, so no failure
    here (EROFS is what unlink answers on a read-only mount, even for no file) matters."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def _unlink_quiet(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ESTALE):
            raise
