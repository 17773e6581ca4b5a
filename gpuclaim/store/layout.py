"""Making the layout once, refusing a foreign directory, and the store's id."""

from __future__ import annotations

import os
from typing import Optional

from gpuclaim.core.errors import StoreError
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import (
    _SUBDIRS,
    LAYOUT_VERSION,
    STORE_ID_FILE,
    _discard,
    _link_exclusive,
    _mkdir_shared,
    _nonce,
    _read_stale_safe,
    storage_error,
)


class LayoutPart(StoreBase):
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
        ours = {*_SUBDIRS, "VERSION", STORE_ID_FILE, "owners", "policy.json"}
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
