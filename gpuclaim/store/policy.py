"""The lab's policy in the store (``core/policy.py``): ``policy.json`` in the store's root,
written only by the account that owns the store's directory (the lab's admin: whoever made
it), so a person in the group cannot loosen a limit for everyone."""

from __future__ import annotations

import json
import os
import stat
from typing import Any

from gpuclaim.core.accounts import account_name, this_account
from gpuclaim.core.errors import StorageRefusesWrites
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import _discard, _encode, _nonce, storage_error

POLICY_FILE = "policy.json"


class PolicyPart(StoreBase):
    def policy(self) -> dict[str, Any]:
        """The lab's policy ({} when none is set, or when the file is not the store owner's
        alone: then ``policy_problem`` says why and nothing of it applies)."""
        return {} if self.policy_problem() else self._read_policy()

    def policy_problem(self) -> str:
        """Why the policy file cannot be the lab's word ("" when it is, or there is none)."""
        path = self._p(POLICY_FILE)
        try:
            st, root = os.lstat(path), os.stat(self.root)
        except FileNotFoundError:
            return ""
        except OSError as exc:
            return f"{path} cannot be read: {exc.strerror}"
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a plain file"
        if st.st_uid not in (root.st_uid, 0):
            return (
                f"{path} belongs to {account_name(st.st_uid)}, not to the store's owner "
                f"{account_name(root.st_uid)}: ignored"
            )
        if st.st_mode & 0o022:
            return f"{path} may be written by others (mode {stat.S_IMODE(st.st_mode):o}): ignored"
        return ""

    def _read_policy(self) -> dict[str, Any]:
        try:
            data = json.loads(self._p(POLICY_FILE).read_bytes().decode("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, UnicodeDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def set_policy(self, policy: dict[str, Any]) -> None:
        """Write the lab's policy: only the store directory's owner (or root) may."""
        owner = os.stat(self.root).st_uid
        me = this_account()
        if me.uid not in (owner, 0):
            raise StorageRefusesWrites(
                f"only {account_name(owner)}, who owns {self.root}, sets the lab's policy "
                f"({me.name} may make their own config stricter)"
            )
        path = self._p(POLICY_FILE)
        tmp = self._p(f".{POLICY_FILE}.{_nonce()}")
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            try:
                os.fchmod(fd, 0o644)
                os.write(fd, _encode(policy))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, path)
        except OSError as exc:
            _discard(tmp)
            raise storage_error(self.root, exc) from exc
