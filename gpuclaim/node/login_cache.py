"""The user's login environment, kept per user per node: what ``$SHELL -l`` changed in the
environment it was given, reused for the next job while nothing it could have read changed.

A job's start would otherwise wait for the user's profile every time (conda's init, module
systems: often the longest part of a start on a real cluster). The key is the login shell,
the environment it starts from (less what differs from one tmux session to the next), and the
size and modification time of every profile file a POSIX login shell reads; a profile edited
is a new key, so the next job sees the change. A kept result older than a day is not used
either (a profile may read what no file here shows). Conda jobs are never kept: an env's
activation depends on the env. Files are the user's own (0600: a profile may export secrets).
Standard library only, Python 3.9.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Optional

MAX_AGE_S = 86400.0
# What a POSIX login shell (sh, bash, zsh, ksh, dash) may read before it prints its environment.
PROFILES = (
    "/etc/environment",
    "/etc/profile",
    "/etc/bash.bashrc",
    "/etc/zsh/zshenv",
    "/etc/zsh/zprofile",
    "/etc/zshenv",
    "/etc/zprofile",
    "~/.profile",
    "~/.bash_profile",
    "~/.bash_login",
    "~/.bashrc",
    "~/.zshenv",
    "~/.zprofile",
    "~/.zshrc",
    "~/.zlogin",
    "~/.kshrc",
)
PROFILE_DIRS = ("/etc/profile.d",)
# Differ between one job's tmux session and the next, and mean nothing to a profile.
VOLATILE = frozenset({"TMUX", "TMUX_PANE", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "_"})


def cache_dir() -> Path:
    return Path.home() / ".cache" / "gpuclaim" / "login-env"


def cache_key(base: dict[str, str], shell: str) -> str:
    """The key of a login shell's result over ``base``; "" when the profiles cannot be read."""
    h = hashlib.sha256()
    h.update(shell.encode())
    stable = sorted((k, v) for k, v in base.items() if k not in VOLATILE)
    h.update(json.dumps(stable).encode("utf-8", "surrogateescape"))
    try:
        for stamp in _stamps():
            h.update(stamp.encode("utf-8", "surrogateescape"))
    except OSError:
        return ""
    return h.hexdigest()[:40]


def _stamps() -> list[str]:
    paths = [Path(p).expanduser() for p in PROFILES]
    for directory in PROFILE_DIRS:
        try:
            paths += sorted(Path(directory).iterdir())
        except FileNotFoundError:
            pass
    stamps = []
    for path in paths:
        try:
            st = path.stat()
        except FileNotFoundError:
            stamps.append(f"{path}:-")
            continue
        stamps.append(f"{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}")
    return stamps


def load(key: str, base: dict[str, str]) -> Optional[dict[str, str]]:
    """``base`` with the kept changes applied, or None (none kept, too old, unreadable)."""
    path = cache_dir() / f"{key}.json"
    try:
        if time.time() - path.stat().st_mtime > MAX_AGE_S:
            return None
        kept = json.loads(path.read_text(encoding="utf-8"))
        changed, removed = dict(kept["set"]), list(kept["unset"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    env = {k: v for k, v in base.items() if k not in removed}
    env.update({str(k): str(v) for k, v in changed.items()})
    return env


def save(key: str, base: dict[str, str], result: dict[str, str]) -> None:
    """Keep what the login shell changed in ``base``; a failure to keep it costs nothing."""
    changed = {k: v for k, v in result.items() if base.get(k) != v and k not in VOLATILE}
    removed = [k for k in base if k not in result and k not in VOLATILE]
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = directory / f".{key}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"set": changed, "unset": removed}, fh)
        tmp.replace(directory / f"{key}.json")
    except OSError:
        pass
