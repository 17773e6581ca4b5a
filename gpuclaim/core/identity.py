"""Who is asking, and validation of the names people type."""

from __future__ import annotations

import functools
import os
import re

from gpuclaim.core.errors import UsageError


@functools.cache  # compiled on first use: a look validates no name
def _name() -> re.Pattern[str]:
    return re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def current_user(configured: str | None = None) -> str:
    """The config's ``user``, else ``$GPUCLAIM_USER``, else the login name."""
    user = configured or os.environ.get("GPUCLAIM_USER") or _login_name()
    return validate_name(user, "user name")


def _login_name() -> str:
    import getpass  # here: only without a configured user (it imports termios)

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"uid{os.getuid()}"


def validate_name(value: str, what: str) -> str:
    """Names end up in file names, tmux sessions and Slack: letters, digits, ``_`` and ``-``."""
    if not _name().match(value):
        raise UsageError(
            f"invalid {what} {value!r}: use 1-64 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return value


def this_host() -> str:
    # uname's nodename is what gethostname() returns, without importing socket at start
    return os.uname().nodename.split(".")[0] or "localhost"


NOTE_LIMIT = 200


def clean_note(note: str, what: str = "--note") -> str:
    """One printable line, bounded: notes are shown in tables, on the board, Slack and JSON."""
    cleaned = "".join(ch if ch.isprintable() else " " for ch in note).strip()
    if len(cleaned) > NOTE_LIMIT:
        raise UsageError(f"{what} is limited to {NOTE_LIMIT} characters")
    return cleaned
