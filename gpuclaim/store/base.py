"""The store's directory, staging and publishing files, locks, and the storage clock."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.errors import StorageRefusesWrites, StoreError
from gpuclaim.core.identity import this_host
from gpuclaim.store.files import (
    FILE_MODE,
    HELD_LOCK_BREAK_S,
    LOCK_BREAK_S,
    LOCK_WAIT_S,
    _break_lock,
    _discard,
    _encode,
    _fix_mode,
    _link_exclusive,
    _nonce,
    _pid_alive,
    _safe,
    _unlink_quiet,
    storage_error,
)


class StoreBase:
    def __init__(self, root: Path, host_lock_dir: Optional[Path] = None) -> None:
        self.root = Path(root)
        self.host_lock_dir = host_lock_dir
        self._clock_offset: Optional[float] = None
        self.host = this_host()
        # Set when the clock probe found that the storage refuses writes (looks say so).
        self.refusal: Optional[StorageRefusesWrites] = None

    def _p(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

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
            # named as every staged file is (host.pid.nonce): a probe its killed writer
            # left is swept as theirs are
            probe = self._p("tmp", f"{self.host}.{os.getpid()}.clock-{_nonce()}")
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

    def clock(self) -> dict[str, Any]:
        """The storage's time and, if it refuses writes, why: what a remote reader needs."""
        now = self.now()
        return {"now": now, "refusal": str(self.refusal) if self.refusal else None}

    def writable(self) -> Optional[str]:
        """None if a claim could be written now; else why not (read-only, full...)."""
        try:
            _discard(self._stage(b"{}\n", sync=False))
        except StoreError as exc:
            return str(exc)
        return None

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
                if self._lock_abandoned(lock, HELD_LOCK_BREAK_S):
                    _break_lock(lock)
                    continue
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"lock {lock} is held for more than {LOCK_WAIT_S:.0f}s",
                        hint="if no gpuclaim is running, run 'gpuclaim gc'",
                    )
                import random  # here: only a lock someone holds is waited for

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

    def lock_held(self, name: str) -> bool:
        """Whether someone alive holds ``try_lock(name)`` (a queue keeper: refreshed while
        it lives)."""
        lock = self._p("locks", f"{_safe(name)}.lock")
        return lock.exists() and not self._lock_abandoned(lock)

    def _lock_abandoned(self, lock: Path, max_age_s: float = LOCK_BREAK_S) -> bool:
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
        return self.now() - st.st_mtime > max_age_s

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
