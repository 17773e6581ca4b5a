"""The first contacts, spawned from what the last call with the same config started.

``remote.early`` starts a cold node's first-contact session as soon as the config is read,
but reading it (tomllib, the config's dataclasses, the remote layer, the agent's version)
is ~50 ms of imports on a first call, all of it before the first key exchange. The exact
ssh command lines it computes depend only on the config file, a few environment variables
and the installed gpuclaim, so each call keeps them (``save``) and the next call with an
unchanged config file spawns them (``spawn_predicted``) with nothing imported but
``subprocess``: as early as a bare Python program could.

A prediction is only a head start, never trusted: ``remote.early`` computes every command
as before and adopts a predicted session only if its command line is the same byte for
byte (``take``); one that differs (a new gpuclaim version, a node now warm) is killed
before it is used (``discard_rest``), and at exit at the latest.
"""

from __future__ import annotations

import atexit
import marshal
import os
import subprocess
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.paths import data_dir, private_dir

FORMAT = 2
# What the ssh command lines depend on besides the config file: which ssh (PATH), where the
# master sockets go (XDG_RUNTIME_DIR, HOME) and gpuclaim's own places (GPUCLAIM_HOME, ...)
_ENV = ("PATH", "HOME", "XDG_RUNTIME_DIR", "GPUCLAIM_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME")

# node name -> (argv, paths whose existence says the node needs no first contact, the private
# directories the session needs: the master's socket directory, gone after a reboot)
Entry = tuple[list[str], list[str], list[str]]
_SPAWNED: dict[str, tuple[list[str], subprocess.Popen[bytes]]] = {}


def _key(config_path: str) -> Optional[tuple[object, ...]]:
    try:
        st = Path(config_path).stat()
    except OSError:
        return None
    env = tuple(os.environ.get(name, "") for name in _ENV)
    return (FORMAT, config_path, st.st_mtime_ns, st.st_size, st.st_ino, env)


def _plan_file(config_path: str) -> Path:
    name = f"plan-{zlib.crc32(config_path.encode('utf-8', 'surrogateescape')):08x}"
    return data_dir() / "early" / name


def _read(config_path: str) -> tuple[Optional[tuple[object, ...]], dict[str, Entry]]:
    """The plan kept for this config, if it is for the config as it is now."""
    key = _key(config_path)
    if key is None:
        return None, {}
    try:
        kept = marshal.loads(_plan_file(config_path).read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return key, {}
    if not isinstance(kept, dict) or kept.get("key") != key:
        return key, {}
    entries = kept.get("nodes")
    return key, entries if isinstance(entries, dict) else {}


def spawn_predicted(config_path: str, names: Optional[Sequence[str]]) -> int:
    """Spawn the first contacts the last call with this config spawned, for the nodes in
    ``names`` (None: every node) whose guard paths are all absent; how many. Never fails."""
    try:
        _key_now, entries = _read(config_path)
        started = 0
        for name, entry in entries.items():
            if names is not None and name not in names:
                continue
            argv, guards, dirs = entry
            if not _valid(argv, guards, dirs) or any(os.path.lexists(p) for p in guards):
                continue
            for folder in dirs:  # made as remote.openssh makes it; refused: no head start
                private_dir(Path(folder), "ssh sockets")
            if not started:
                atexit.register(discard_rest)
            _SPAWNED[name] = (argv, spawn(argv))
            started += 1
        return started
    except (OSError, ValueError, TypeError, GpuclaimError):  # a head start only
        return len(_SPAWNED)


def _valid(argv: object, *paths: object) -> bool:
    def strings(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    return strings(argv) and bool(argv) and all(strings(p) for p in paths)


def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
    """One first-contact session, with the pipes the fan-out adopts (``remote.early`` starts
    the ones no plan predicted with it too)."""
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
    )


def take(name: str, argv: Sequence[str]) -> Optional[subprocess.Popen[bytes]]:
    """The session predicted for ``name``, if its command line is exactly ``argv``."""
    held = _SPAWNED.get(name)
    if held is None or held[0] != list(argv):
        return None
    del _SPAWNED[name]
    return held[1]


def discard_rest() -> None:
    """Kill every predicted session nothing took (its command was not the one needed)."""
    while _SPAWNED:
        _name, (_argv, proc) = _SPAWNED.popitem()
        proc.kill()
        proc.wait()


def save(config_path: str, entries: Iterable[tuple[str, list[str], list[str], list[str]]]) -> None:
    """Keep what this call computed, merged into the plan kept for the same config (a call
    with ``--node`` computes only that node's); written only when it changed."""
    key, kept = _read(config_path)
    if key is None:
        return
    plan = dict(kept)
    for name, argv, guards, dirs in entries:
        plan[name] = (list(argv), list(guards), list(dirs))
    if plan == kept:
        return
    path = _plan_file(config_path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_bytes(marshal.dumps({"key": key, "nodes": plan}))
        tmp.replace(path)
    except OSError:  # a cache: a read-only home only makes the next first call slower
        tmp.unlink(missing_ok=True)
