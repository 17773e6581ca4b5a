"""What every command needs: the loaded config, the store, the user, and output helpers."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console

from gpuclaim.config import Config, load_config
from gpuclaim.errors import GpuclaimError
from gpuclaim.identity import current_user
from gpuclaim.paths import host_lock_dir
from gpuclaim.store import ClaimStore


@dataclass
class AppState:
    """Set by the top-level callback from the global options; loaded lazily."""

    config_path: Optional[Path] = None
    _config: Optional[Config] = field(default=None, repr=False)
    _store: Optional[ClaimStore] = field(default=None, repr=False)

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    @property
    def user(self) -> str:
        return current_user(self.config.user)

    @property
    def store(self) -> ClaimStore:
        if self._store is None:
            storage = self.config.storage
            if storage.startswith("ssh://"):
                raise GpuclaimError(
                    f"storage {storage}: ssh:// storage needs the node agent, not in this build",
                    hint="mount the storage and give its path",
                )
            store = ClaimStore(self.config.storage_path, host_lock_dir())
            store.ensure()
            self._store = store
        return self._store


def state(ctx: typer.Context) -> AppState:
    root = ctx.find_root()
    if not isinstance(root.obj, AppState):
        root.obj = AppState()
    return root.obj


def out() -> Console:
    """stdout: colour only on a terminal (rich honours NO_COLOR); in a pipe, lines are never
    wrapped at 80 columns, so scripts can grep whole rows."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(highlight=False, width=240, no_color=True)


def err() -> Console:
    return Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")
