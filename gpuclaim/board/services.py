"""What the board needs from the outside world, in one object the CLI and the tests build."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

from gpuclaim.core.config import Config
from gpuclaim.engine.cluster import NodeProber
from gpuclaim.engine.launch import NodeOps
from gpuclaim.store import Store


@dataclass(frozen=True)
class BoardOptions:
    """How the board looks and how often it asks: the ``gpuclaim board`` flags."""

    refresh_s: float = 2.0
    compact: bool = False
    users: tuple[str, ...] = ()  # show only GPUs these users hold
    nodes: tuple[str, ...] = ()  # show only these nodes
    log_lines: int = 200  # lines of a job's log shown when the panel opens


def run_in_terminal(argv: Sequence[str]) -> int:
    """Run ``argv`` on the real terminal (the board is suspended meanwhile)."""
    env = dict(os.environ)
    # Inside tmux, attaching to another tmux session refuses to nest unless TMUX is unset.
    env.pop("TMUX", None)
    return subprocess.call(list(argv), env=env)


@dataclass
class BoardServices:
    """The config, the store, the user and the one prober (it holds the SSH connections, so
    one lives as long as the app), plus the clock and the terminal hand-over as seams."""

    config: Config
    store: Store
    user: str
    prober: NodeProber
    ops: NodeOps
    options: BoardOptions = field(default_factory=BoardOptions)
    clock: Callable[[], float] = time.time
    foreground: Callable[[Sequence[str]], int] = run_in_terminal
