"""Where gpuclaim keeps things; ``GPUCLAIM_HOME`` moves all of it (tests point it at tmp_path)."""

from __future__ import annotations

import os
from pathlib import Path

from gpuclaim.core.errors import GpuclaimError


def home_override() -> Path | None:
    value = os.environ.get("GPUCLAIM_HOME")
    return Path(value).expanduser() if value else None


def config_path() -> Path:
    """``$GPUCLAIM_CONFIG``, else ``$GPUCLAIM_HOME/config.toml``, else the XDG config dir."""
    explicit = os.environ.get("GPUCLAIM_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    home = home_override()
    if home is not None:
        return home / "config.toml"
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "gpuclaim" / "config.toml"


def data_dir() -> Path:
    """Per-user data: the default local store, the demo sandbox, caches, host-local locks."""
    home = home_override()
    if home is not None:
        return home
    base = os.environ.get("XDG_DATA_HOME") or str(Path("~/.local/share").expanduser())
    return Path(base) / "gpuclaim"


def host_lock_dir() -> Path:
    """Host-local lock files (never on shared storage: flock does not exclude across NFS)."""
    return data_dir() / "locks"


def private_dir(path: Path, use: str, error: type[GpuclaimError] = GpuclaimError) -> Path:
    """``path``, made 0700 if missing, for sockets only this user may reach: refused when
    someone else owns it, made private again when it is ours but open."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise error(f"{path} belongs to someone else: not using it for {use}")
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path
