"""``status`` answered without typer: a look is the command typed most (in loops, by cron,
by scripts reading ``--json``), and typer with click and their imports is ~30 ms of its
~150 ms of CPU, on a path whose whole point is the plain tools' speed.

What is taken here is a strict subset of what the typer app accepts, read the same way:
the global ``--config PATH`` (or ``$GPUCLAIM_CONFIG``) and ``--debug`` before the command,
then ``status`` (or ``ls``) with ``--json``, ``-q``/``--quiet`` and ``--node NAME``. Anything
else (help, a typo, another option, a value that looks like an option) returns None and the
typer app answers it, errors and all; the command itself is the same function
(``cli.status_show.show_status``) either way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Optional

_COMMANDS = frozenset({"status", "ls"})


def leading_globals(args: list[str]) -> Optional[tuple[Optional[str], int]]:
    """The global ``--config`` before the command (None: not given) and where the command
    is, if only ``--config PATH`` / ``--config=PATH`` and ``--debug`` come before it; None
    for anything else there (help, a typo, a value that looks like an option): the typer
    app reads those, errors and all."""
    config: Optional[str] = None
    i = 0
    while i < len(args) and args[i].startswith("-"):
        arg = args[i]
        if arg == "--config" and i + 1 < len(args) and _is_value(args[i + 1]):
            config, i = args[i + 1], i + 2
        elif arg.startswith("--config=") and len(arg) > len("--config="):
            config, i = arg.split("=", 1)[1], i + 1
        elif arg == "--debug":  # main() reads it from the arguments itself
            i += 1
        else:
            return None
    return config, i


def fast_command(args: list[str]) -> Optional[Callable[[], int]]:
    """The command ``args`` ask for, if it is one answered without typer; else None."""
    leading = leading_globals(args)
    if leading is None:
        return None
    config, i = leading
    if i >= len(args) or args[i] not in _COMMANDS:
        return None
    options = _status_options(args[i + 1 :])
    if options is None:
        return None
    nodes, as_json, quiet = options
    if config is None:
        config = os.environ.get("GPUCLAIM_CONFIG") or None  # typer's envvar for --config
    path = Path(config) if config is not None else None
    return lambda: _status(path, nodes, as_json, quiet)


def _status_options(rest: list[str]) -> Optional[tuple[Optional[list[str]], bool, bool]]:
    nodes: list[str] = []
    as_json = quiet = False
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--json":
            as_json = True
        elif arg in ("-q", "--quiet"):
            quiet = True
        elif arg == "--node" and i + 1 < len(rest) and _is_value(rest[i + 1]):
            nodes.append(rest[i + 1])
            i += 1
        elif arg.startswith("--node=") and len(arg) > len("--node="):
            nodes.append(arg.split("=", 1)[1])
        else:
            return None
        i += 1
    return (nodes or None), as_json, quiet


def _is_value(arg: str) -> bool:
    return bool(arg) and not arg.startswith("-")


def _status(config: Optional[Path], nodes: Optional[list[str]], as_json: bool, quiet: bool) -> int:
    from gpuclaim.cli.app_state import AppState
    from gpuclaim.cli.status_show import show_status

    st = AppState(config_path=config, looking=True)
    try:
        return show_status(st, nodes, as_json, quiet)
    finally:
        st.finish()  # as the typer app's root callback has it run when the command closes
