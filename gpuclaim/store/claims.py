"""Claim files: the snapshot (every claim judged against the storage clock), taking GPUs
all or nothing, removing and rewriting them under their locks."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.errors import ConflictError
from gpuclaim.core.model import Claim
from gpuclaim.core.share_policy import holders_text
from gpuclaim.core.states import SERVICE_DOWN, GpuState
from gpuclaim.store.files import (
    INCOMPLETE_GRACE_S,
    JOB_START_GRACE_S,
    LAUNCH_GRACE_S,
    _again_if_stale,
    _discard,
    _encode,
    _link_exclusive,
    _listdir_stale_safe,
    _nonce,
    _pid_alive,
    _read_with_stat,
    _unlink_quiet,
    storage_error,
)
from gpuclaim.store.shares import SharesPart, is_share_path
from gpuclaim.store.types import ClaimFile, ClaimStatus, Snapshot


class ClaimsPart(SharesPart):
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
        snap.shares = self._read_shares(gpus_dir, names)
        snap.beats = self._beats()
        every = [*snap.files.values(), *(f for fs in snap.shares.values() for f in fs)]
        snap.claims = self._judge(every, now, snap.beats)
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
        files: Iterable[ClaimFile],
        now: float,
        beats: Optional[dict[str, dict[str, Any]]] = None,
    ) -> dict[str, ClaimStatus]:
        by_id: dict[str, list[ClaimFile]] = {}
        for f in files:
            if f.claim is not None:
                by_id.setdefault(f.claim.id, []).append(f)
        result: dict[str, ClaimStatus] = {}
        for claim_id, parts in by_id.items():
            claim = parts[0].claim
            assert claim is not None
            present = tuple(sorted(p.uuid for p in parts))
            if len(present) < len(claim.gpus):
                if self._claimer_alive(claim) and now - claim.since < INCOMPLETE_GRACE_S:
                    result[claim_id] = ClaimStatus(claim, GpuState.CLAIMED, "in progress", present)
                else:
                    result[claim_id] = ClaimStatus(claim, GpuState.STALE, "incomplete", present)
            elif now >= claim.expires:
                result[claim_id] = ClaimStatus(claim, GpuState.STALE, "expired", present)
            elif claim.job and self._job_lost(claim, (beats or {}).get(claim.id), now):
                if claim.service:  # held while it should run: a look brings it back
                    result[claim_id] = ClaimStatus(claim, GpuState.CLAIMED, SERVICE_DOWN, present)
                else:
                    result[claim_id] = ClaimStatus(claim, GpuState.STALE, "job lost", present)
            else:
                result[claim_id] = ClaimStatus(claim, GpuState.CLAIMED, "", present)
        return result

    def _job_lost(self, claim: Claim, beat: Optional[dict[str, Any]], now: float) -> bool:
        """A job's claim whose wrapper stopped beating (node rebooted, tmux killed) is lost;
        so is one whose wrapper never beat while the `run` that claimed it died here."""
        if beat is not None:
            return bool(now - beat["mtime"] > 3 * beat["interval"] + 2)
        if now - claim.since > JOB_START_GRACE_S:
            return True
        launcher_dead = claim.host == self.host and claim.pid > 0 and not _pid_alive(claim.pid)
        return launcher_dead and now - claim.since > LAUNCH_GRACE_S

    def _claimer_alive(self, claim: Claim) -> bool:
        """On the claimer's own host we can tell; elsewhere assume alive until the grace ends."""
        if claim.host != self.host or claim.pid <= 0:
            return True
        return _pid_alive(claim.pid)

    def acquire(self, claim: Claim) -> None:
        """Publish ``claim`` on all its GPUs or on none; ConflictError names the holder. A
        share (``claim.shared``) is taken beside the GPU's other shares (store/shares.py)."""
        if claim.shared:
            self._acquire_share(claim)
            return
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
            # Linked first, shares looked for second (store/shares.py: the two-flag exclusion)
            for gpu in claim.gpus:
                found = self.shares_in_way(gpu.uuid)
                if found:
                    sharing = [f.claim for f in found if f.claim is not None]
                    self._give_back(claim.id, taken)
                    taken = []
                    raise ConflictError(_shared_message(claim.node, gpu.index, sharing))
        except OSError as exc:
            self._give_back(claim.id, taken)
            raise storage_error(self.root, exc) from exc
        finally:
            _discard(tmp)

    def _give_back(self, claim_id: str, uuids: Iterable[str]) -> None:
        for gpu_uuid in uuids:
            self.remove_gpu(gpu_uuid, claim_id)

    def remove_gpu(self, gpu_uuid: str, claim_id: Optional[str], *, inode: int = 0) -> bool:
        """Remove ``gpus/<uuid>.claim`` if it still holds ``claim_id`` (or, for a corrupt file,
        is still the same inode). True if this call removed it. A share's file is its own."""
        if claim_id is not None and self._remove_share(gpu_uuid, claim_id):
            return True
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
        share = is_share_path(cf.path)
        with self.gpu_lock(cf.uuid):
            if share:
                current = self._read_share_file(cf.path, cf.uuid)
            else:
                current = self._read_claim_file(cf.path)
            if current is None or current.claim is not None or current.inode != cf.inode:
                return False
            if current.unreadable:
                return False
            kind = "share" if share else "claim"
            dest = self._p("corrupt", f"{cf.uuid}.{int(self.now())}.{_nonce()}.{kind}")
            try:
                os.rename(cf.path, dest)
            except FileNotFoundError:
                return False
            return True

    def rewrite(self, old: Claim, new: Claim) -> None:
        """Replace a whole claim's files (extend): each under its lock, only if still ``old``."""
        if old.shared:
            self._rewrite_share(old, new)
            return
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


def _shared_message(node: str, index: int, sharing: list[Claim]) -> str:
    if not sharing:
        return f"{node} GPU {index} holds a damaged share file ('gpuclaim gc' sets it aside)"
    holders = holders_text([(c.user, c.mem_mib) for c in sharing], None)
    return f"{node} GPU {index} is shared ({holders}): a whole claim waits until they end"


def _held_message(gpu_uuid: str, holder: Optional[ClaimFile]) -> str:
    if holder is not None and holder.claim is not None:
        c = holder.claim
        index = next((g.index for g in c.gpus if g.uuid == gpu_uuid), "?")
        return f"{c.node} GPU {index} is held by {c.user} (claim {c.id})"
    return f"GPU {gpu_uuid} was just taken by someone else"
