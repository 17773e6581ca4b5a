"""Shares of one GPU (``--gpu-mem``): one file per share, ``gpus/<uuid>.shares/<claim>.share``.

A share is a claim of part of one GPU's memory. Its contract, beside the whole claims':

* Shares of a GPU are taken under that GPU's lock (the one removals and rewrites take): the
  memory already shared is counted and the new share written in one step, so racing share
  claimers never hold more than the GPU has. A damaged share file counts as the whole GPU
  until ``gc`` sets it aside: what it held cannot be known.
* Shares and a whole claim exclude each other without a lock on the whole claim's path
  (whole claims stay one ``link``): each side publishes its own file first and looks for the
  other's second, and steps back if it finds one (the two-flag exclusion of Dekker). Both
  may step back at once; neither ever holds the GPU beside the other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from gpuclaim.core.errors import ConflictError
from gpuclaim.core.model import Claim
from gpuclaim.core.share_policy import format_mib, holders_text
from gpuclaim.store.drains import DrainsPart
from gpuclaim.store.files import (
    _again_if_stale,
    _discard,
    _encode,
    _link_exclusive,
    _listdir_stale_safe,
    _mkdir_shared,
    _read_with_stat,
    _safe,
    _unlink_quiet,
    storage_error,
)
from gpuclaim.store.types import ClaimFile

SHARES_SUFFIX = ".shares"
SHARE_SUFFIX = ".share"


def is_share_path(path: Path) -> bool:
    return path.parent.name.endswith(SHARES_SUFFIX)


class SharesPart(DrainsPart):
    def _shares_dir(self, gpu_uuid: str) -> Path:
        return self._p("gpus", f"{_safe(gpu_uuid)}{SHARES_SUFFIX}")

    def _share_path(self, gpu_uuid: str, claim_id: str) -> Path:
        return self._shares_dir(gpu_uuid) / f"{_safe(claim_id)}{SHARE_SUFFIX}"

    def _read_shares(self, gpus_dir: Path, names: list[str]) -> dict[str, list[ClaimFile]]:
        """Every GPU's share files as read (``names``: the listing of ``gpus/``)."""
        shares: dict[str, list[ClaimFile]] = {}
        for name in names:
            if name.endswith(SHARES_SUFFIX):
                gpu_uuid = name[: -len(SHARES_SUFFIX)]
                found = self._share_files(gpus_dir / name, gpu_uuid)
                if found:
                    shares[gpu_uuid] = found
        return shares

    def _share_files(self, directory: Path, gpu_uuid: str) -> list[ClaimFile]:
        try:
            names = _listdir_stale_safe(directory)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise storage_error(self.root, exc, "read") from exc
        found = []
        for name in sorted(names):
            if name.endswith(SHARE_SUFFIX):
                cf = self._read_share_file(directory / name, gpu_uuid)
                if cf is not None:
                    found.append(cf)
        return found

    def _read_share_file(self, path: Path, gpu_uuid: str) -> Optional[ClaimFile]:
        try:
            st, raw = _again_if_stale(lambda: _read_with_stat(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            return ClaimFile(gpu_uuid, path, 0.0, 0, error=f"unreadable: {exc.strerror}")
        try:
            claim = Claim.from_dict(json.loads(raw.decode("utf-8")))
            if claim.uuids != [gpu_uuid] or not claim.shared:
                raise ValueError("file does not belong to the share it holds")
            if path.name != f"{claim.id}{SHARE_SUFFIX}":
                raise ValueError("file name is not its claim's id")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            return ClaimFile(gpu_uuid, path, st.st_mtime, st.st_ino, error=f"corrupt: {exc}")
        return ClaimFile(gpu_uuid, path, st.st_mtime, st.st_ino, claim=claim)

    def _acquire_share(self, claim: Claim) -> None:
        """Publish a share of one GPU, or raise ConflictError saying what holds its memory."""
        if len(claim.gpus) != 1 or claim.mem_mib <= 0 or claim.mem_total_mib <= 0:
            raise ValueError("a share holds part of exactly one GPU of a known size")
        gpu = claim.gpus[0]
        whole = self._p("gpus", f"{gpu.uuid}.claim")
        target = self._share_path(gpu.uuid, claim.id)
        tmp = self._stage(_encode(claim.to_dict()))
        try:
            with self.gpu_lock(gpu.uuid):
                if os.path.lexists(whole):
                    raise ConflictError(f"{claim.node} GPU {gpu.label} is held whole")
                _mkdir_shared(target.parent)
                held = self._share_files(target.parent, gpu.uuid)
                self._check_room(claim, held)
                if not _link_exclusive(tmp, target):
                    raise ConflictError(f"share {claim.id} exists already")
            # Published first, the whole claim looked for second (see the module's contract)
            if os.path.lexists(whole):
                self._remove_share(gpu.uuid, claim.id)
                raise ConflictError(f"{claim.node} GPU {gpu.label} was just claimed whole")
        except OSError as exc:
            raise storage_error(self.root, exc) from exc
        finally:
            _discard(tmp)

    def _check_room(self, claim: Claim, held: list[ClaimFile]) -> None:
        now = self.now()
        damaged = [f for f in held if f.claim is None]
        if damaged:
            raise ConflictError(
                f"{claim.node} GPU {claim.gpus[0].label} has a damaged share file "
                f"({damaged[0].error}): what it holds cannot be known",
                hint="'gpuclaim gc' sets it aside",
            )
        live = [f.claim for f in held if f.claim is not None and f.claim.expires > now]
        used = sum(c.mem_mib for c in live)
        if used + claim.mem_mib > claim.mem_total_mib:
            free = claim.mem_total_mib - used
            holders = holders_text([(c.user, c.mem_mib) for c in live], free)
            raise ConflictError(
                f"{claim.node} GPU {claim.gpus[0].label} has {format_mib(free)} unshared, "
                f"{format_mib(claim.mem_mib)} wanted ({holders})"
            )

    def shares_in_way(self, gpu_uuid: str) -> list[ClaimFile]:
        """The share files on a GPU (a whole claimer looks for them after linking its file)."""
        return self._share_files(self._shares_dir(gpu_uuid), gpu_uuid)

    def _remove_share(self, gpu_uuid: str, claim_id: str) -> bool:
        """Remove one share's file if it still holds ``claim_id``. True if this call did."""
        target = self._share_path(gpu_uuid, claim_id)
        if not os.path.lexists(target):
            return False
        with self.gpu_lock(gpu_uuid):
            current = self._read_share_file(target, gpu_uuid)
            if current is None or current.claim is None or current.claim.id != claim_id:
                return False
            _unlink_quiet(target)
            return True

    def _rewrite_share(self, old: Claim, new: Claim) -> None:
        gpu_uuid = old.uuids[0]
        target = self._share_path(gpu_uuid, old.id)
        with self.gpu_lock(gpu_uuid):
            current = self._read_share_file(target, gpu_uuid)
            if current is None or current.claim is None or current.claim.id != old.id:
                raise ConflictError(f"claim {old.id} changed while extending it; try again")
            tmp = self._stage(_encode(new.to_dict()))
            try:
                os.rename(tmp, target)
            except OSError as exc:
                _discard(tmp)
                raise storage_error(self.root, exc) from exc
