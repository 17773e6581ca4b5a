"""Who runs a process on a GPU: the owner of its /proc entry, as a user name."""

from __future__ import annotations

import pwd
from pathlib import Path

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Optional


def process_user(pid: int) -> Optional[str]:
    """The login name owning ``pid`` on this machine, or None if it is gone or hidden."""
    try:
        uid = Path(f"/proc/{pid}").stat().st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"
