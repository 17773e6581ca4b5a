"""Where gpuclaim keeps things; ``GPUCLAIM_HOME`` moves all of it (tests point it at tmp_path)."""

from __future__ import annotations

import os
import stat
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


SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes on Linux, one of them the NUL


def socket_fits(directory: Path, name_bytes: int) -> bool:
    """Whether a socket named with ``name_bytes`` bytes fits in ``directory`` (counted in
    bytes, as the kernel does: a home with non-ASCII letters is longer than it looks)."""
    return len(os.fsencode(str(directory))) + 1 + name_bytes <= SUN_PATH_MAX


def socket_dir(
    preferred: list[Path],
    name_bytes: int,
    tag: str,
    use: str,
    error: type[GpuclaimError] = GpuclaimError,
) -> Path:
    """The first of ``preferred`` where a socket name of ``name_bytes`` bytes fits and that
    can be made private, else a short private directory in the temp dir, named by ``tag``,
    the user and the home (two homes of one user, as on a test machine, keep apart)."""
    for path in preferred:
        if socket_fits(path, name_bytes):
            try:
                return private_dir(path, use, error)
            except (OSError, GpuclaimError):
                continue  # e.g. someone else's XDG_RUNTIME_DIR after su: the fallback
    import zlib  # builtin, cheap; only on the fallback path

    home = f"{zlib.crc32(os.fsencode(str(Path.home()))):08x}"
    name = f"gpuclaim-{tag}-{os.getuid()}-{home}"
    bases = [os.environ.get("TMPDIR") or "/tmp", "/tmp"]
    for base in dict.fromkeys(bases):
        path = Path(base) / name
        if socket_fits(path, name_bytes):
            return private_dir(path, use, error)
    raise error(f"no directory short enough for {use} (TMPDIR={bases[0]})")


def private_dir(path: Path, use: str, error: type[GpuclaimError] = GpuclaimError) -> Path:
    """``path``, made 0700 if missing, for sockets only this user may reach: refused when
    someone else owns it or it is not a plain directory (a link put in a shared /tmp), made
    private again when it is ours but open."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise error(f"cannot make {path} for {use}: {exc.strerror or exc}") from None
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise error(f"{path} is not a directory: not using it for {use}")
    if info.st_uid != os.getuid():
        raise error(f"{path} belongs to someone else: not using it for {use}")
    if info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def which(program: str) -> str | None:
    """``shutil.which(program)`` for a bare name on POSIX: the first executable file of that
    name on ``PATH``. Each look asks for ``ssh``; ``shutil`` would import ``bz2``, ``lzma``
    and ``fnmatch`` (~2 ms of a first call) for its archive functions."""
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = Path(directory or os.curdir) / program
        if os.access(candidate, os.X_OK) and not candidate.is_dir():
            return str(candidate)
    return None
