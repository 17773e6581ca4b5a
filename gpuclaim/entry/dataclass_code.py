"""The code ``@dataclass`` generates, compiled once per interpreter and kept.

On Python 3.9-3.12 ``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``
(and a frozen class's ``__setattr__``, ``__delattr__``, ``__hash__``) as source text and
compiles it with ``exec``, one function at a time: ~0.1 ms each, some 190 on a look's path,
~15 % of a first call's CPU (py-spy, 2 cores). The text is the same from one call to the
next, so the compiled code is kept (``marshal``, one file per interpreter version, under the
data directory) and ``dataclasses``' ``exec`` runs that: the same functions from the same
text, without the compiler. A text not seen before is compiled as ever and kept at exit.
Python 3.13+ compiles a class's functions in one go and is left alone.

Only the CLI installs it (``entry.main``); the node side never does.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import marshal
import os
import sys
from pathlib import Path
from types import CodeType
from typing import Any, Optional

FORMAT = 1
KEEP_AT_MOST = 4000  # texts: past that, only what this process used is kept

_codes: dict[str, CodeType] = {}
_used: set[str] = set()
_compiled = 0  # texts compiled by this process: the file is written only if some were


def cached_exec(source: Any, globals: Optional[dict[str, Any]] = None, locals: Any = None) -> None:
    """``exec`` as ``dataclasses`` calls it, with a source text's code compiled only once."""
    global _compiled
    if isinstance(source, str):
        code = _codes.get(source)
        if code is None:
            code = compile(source, "<string>", "exec")  # what exec(str) itself compiles
            _codes[source] = code
            _compiled += 1
        _used.add(source)
        source = code
    builtins.exec(source, globals, locals)


def cache_file(directory: Path) -> Path:
    return directory / f"dataclass-code-{sys.implementation.cache_tag}-{sys.hexversion:x}.marshal"


def install(directory: Path) -> bool:
    """Route ``dataclasses``' ``exec`` through the kept code (loaded from ``directory``) and
    keep what this process compiles at exit. False where this Python needs none."""
    import dataclasses

    if not hasattr(dataclasses, "_create_fn") or "exec" in vars(dataclasses):
        return False  # 3.13+: one compile per class already; or done before
    path = cache_file(directory)
    _codes.update(load(path))
    dataclasses.exec = cached_exec  # type: ignore[attr-defined]  # found before the builtin
    atexit.register(save, path)
    return True


def load(path: Path) -> dict[str, CodeType]:
    """The kept code by source text; nothing from a missing, torn or foreign file."""
    try:
        kept = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if not (isinstance(kept, tuple) and len(kept) == 2 and kept[0] == FORMAT):
        return {}
    codes = kept[1]
    if not isinstance(codes, dict):
        return {}
    return {k: v for k, v in codes.items() if isinstance(k, str) and isinstance(v, CodeType)}


def save(path: Path) -> None:
    """Keep the code, if this process compiled any (whole file or none: a rename)."""
    if not _compiled:
        return
    codes = _codes if len(_codes) <= KEEP_AT_MOST else {k: _codes[k] for k in _used}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_bytes(marshal.dumps((FORMAT, codes)))
        tmp.replace(path)
    except OSError:  # a read-only home: the next call compiles, as without it
        with contextlib.suppress(OSError):
            tmp.unlink()
