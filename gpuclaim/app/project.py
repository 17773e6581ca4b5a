"""A project's own run defaults: ``gpuclaim.toml``, or a ``[tool.gpuclaim]`` table in
``pyproject.toml``, in the directory ``run`` is typed in or the nearest one above it, so that
``gpuclaim run -- python train.py`` is the whole command::

    gpus = 2              # -n
    nodes = 1             # --nodes
    time = "8h"           # --time
    venv = ".venv"        # --venv (relative: to the job's workdir), or conda = "ml"
    sync = true           # --sync, of the project's directory (the one holding this file)
    sync_exclude = ["*.log", "wandb/"]   # on top of .gitignore, as .gitignore patterns
    sync_max = "4GiB"     # a bigger --sync is refused (default: [run] sync_max, 1 GiB)
    env = { WANDB_MODE = "offline" }     # --env

``run``'s flags win over it; it wins over the config's ``[run]`` table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from gpuclaim.app.configfile import toml_module
from gpuclaim.core.config import size_setting
from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import ConfigError, GpuclaimError

KEYS = {"gpus", "nodes", "time", "venv", "conda", "sync", "sync_exclude", "sync_max", "env"}


@dataclass(frozen=True)
class ProjectDefaults:
    """A project's defaults for ``run`` (``gpuclaim.toml`` or ``[tool.gpuclaim]``); all unset
    outside a project."""

    path: Optional[Path] = None  # the file they came from
    gpus: Optional[int] = None
    nodes: Optional[int] = None
    time_s: Optional[float] = None
    venv: Optional[str] = None
    conda: Optional[str] = None
    sync: bool = False
    sync_exclude: tuple[str, ...] = ()
    sync_max: Optional[int] = None  # bytes
    env: tuple[tuple[str, str], ...] = ()

    @property
    def root(self) -> Optional[Path]:
        """The project's directory: what ``sync = true`` copies."""
        return self.path.parent if self.path else None


def find_project(start: Path) -> ProjectDefaults:
    """The defaults of the project ``start`` is in (none: all unset)."""
    for directory in (start, *start.parents):
        own = directory / "gpuclaim.toml"
        if own.is_file():
            return _parse(own, _read(own))
        pyproject = directory / "pyproject.toml"
        if pyproject.is_file():
            table = _read(pyproject).get("tool", {}).get("gpuclaim")
            if isinstance(table, dict):
                return _parse(pyproject, table, "tool.gpuclaim.")
    return ProjectDefaults()


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return dict(toml_module().load(fh))
    except OSError as exc:
        raise ConfigError(f"project file {path}: {exc.strerror or exc}") from None
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise ConfigError(f"project file {path}: {exc}") from None


def _parse(path: Path, table: dict[str, Any], prefix: str = "") -> ProjectDefaults:
    def bad(key: str, what: str) -> ConfigError:
        return ConfigError(f"project file {path}: '{prefix}{key}' must be {what}")

    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise ConfigError(
            f"project file {path}: unknown key '{prefix}{unknown[0]}' "
            f"(known: {', '.join(sorted(KEYS))})"
        )
    counts: dict[str, Optional[int]] = {}
    for key in ("gpus", "nodes"):
        value = table.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise bad(key, "a whole number >= 1")
        counts[key] = value
    time_s = None
    if "time" in table:
        if not isinstance(table["time"], str):
            raise bad("time", 'a duration such as "8h"')
        try:
            time_s = parse_duration(table["time"])
        except GpuclaimError as exc:
            raise ConfigError(f"project file {path}: '{prefix}time': {exc.message}") from None
    names: dict[str, Optional[str]] = {}
    for key in ("venv", "conda"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise bad(key, "a non-empty string")
        names[key] = value.strip() if isinstance(value, str) else None
    if names["venv"] and names["conda"]:
        raise ConfigError(f"project file {path}: sets both venv and conda: a job runs in one")
    sync = table.get("sync", False)
    if not isinstance(sync, bool):
        raise bad("sync", "true or false")
    exclude = table.get("sync_exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
        raise bad("sync_exclude", "a list of .gitignore patterns")
    sync_max = size_setting(table.get("sync_max"), f"project file {path}: '{prefix}sync_max'", 0)
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise bad("env", "a table of strings")
    return ProjectDefaults(
        path=path,
        gpus=counts["gpus"],
        nodes=counts["nodes"],
        time_s=time_s,
        venv=names["venv"],
        conda=names["conda"],
        sync=sync,
        sync_exclude=tuple(exclude),
        sync_max=sync_max or None,
        env=tuple(sorted((str(k), v) for k, v in env.items())),
    )
