"""Copying a job's files between this machine and a node (``run --sync``, ``pull``), through
the same SSH path as everything else: rsync over the master's connection where both ends have
rsync (incremental: it updates in place a tree the node has filled with a copy of an earlier
copy), a tar stream over the SSH command channel otherwise (fabric, or a node without rsync)."""

from __future__ import annotations

import io
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuclaim.core.config import NodeConfig
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.remote.agent_client import CommandRunner
from gpuclaim.remote.openssh import OpenSshPool

COPY_TIMEOUT_S = 3600.0


class TreeCopies:
    """``engine.sync.TreeCopier`` over a process's SSH pool (or this machine's filesystem)."""

    def __init__(self, pool: Callable[[], CommandRunner]) -> None:
        self._pool = pool  # a callable giving the pool: opened on first use

    @property
    def pool(self) -> CommandRunner:
        return self._pool()

    def rsyncs_to(self, node: NodeConfig) -> bool:
        if shutil.which("rsync") is None:
            return False
        return node.transport == "local" or isinstance(self.pool, OpenSshPool)

    def push_tree(
        self,
        node: NodeConfig,
        root: str,
        files: Sequence[str],
        target: dict[str, Any],
        left_out: Sequence[str] = (),
    ) -> str:
        dest = str(target["dest"])
        rsync = shutil.which("rsync") is not None and bool(target.get("rsync"))
        # rsync walks the tree with what is not copied left out: a list of every file
        # (--files-from) costs it twice the time of an incremental update. No --link-dest:
        # a changed file arrives as a new file renamed over the old name, an unchanged one
        # is the node's own copy, so no two copies share a file a job may write in place.
        walk = ["--from0", "--exclude-from=-", "--exclude=.git", f"{root}/"]
        rules = "\0".join(f"/{_literal(p)}" for p in left_out).encode("utf-8", "surrogateescape")
        if node.transport == "local":
            if rsync:
                _rsync([*walk, f"{dest}/"], rules)
                return "rsync"
            _copy_files(Path(root), files, Path(dest))
            return "copy"
        pool = self.pool
        if rsync and isinstance(pool, OpenSshPool):
            _rsync(["-e", _ssh(pool), *walk, f"{node.host}:{dest}/"], rules)
            return "rsync"
        result = pool.run(
            node.host, f"tar -xf - -C {shlex.quote(dest)}", _tar(Path(root), files), COPY_TIMEOUT_S
        )
        if result.exit_code != 0:
            raise GpuclaimError(f"tar on {node.name}: {_last_line(result.stderr)}")
        return "tar"

    def pull_tree(
        self, node: NodeConfig, directory: str, paths: Sequence[str], into: str, rsync: bool
    ) -> str:
        rsync = rsync and shutil.which("rsync") is not None
        if node.transport == "local":
            _copy_files(Path(directory), paths, Path(into))
            return "copy"
        pool = self.pool
        if rsync and isinstance(pool, OpenSshPool):
            sources = [f"{node.host}:{directory}/./{p}" for p in paths]
            _rsync(["-R", "-e", _ssh(pool), *sources, f"{into}/"], b"")
            return "rsync"
        quoted = " ".join(shlex.quote(p) for p in paths)
        result = pool.run(
            node.host, f"tar -cf - -C {shlex.quote(directory)} -- {quoted}", None, COPY_TIMEOUT_S
        )
        if result.exit_code != 0:
            raise GpuclaimError(f"tar on {node.name}: {_last_line(result.stderr)}")
        _untar(result.stdout, Path(into))
        return "tar"


def _literal(path: str) -> str:
    """``path`` as an rsync pattern matching only itself (its wildcards escaped: rsync reads
    a backslash as an escape only in a pattern that has a wildcard, and each of these has)."""
    if not any(c in path for c in "*?["):
        return path
    return "".join("\\" + c if c in "*?[\\" else c for c in path)


def _ssh(pool: OpenSshPool) -> str:
    """The ssh command rsync runs: the pool's own (its master, its config, batch mode)."""
    return " ".join(shlex.quote(a) for a in pool.base)


def _rsync(args: list[str], stdin: bytes) -> None:
    try:
        proc = subprocess.run(
            ["rsync", "-a", "-s", *args], input=stdin, capture_output=True, timeout=COPY_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise GpuclaimError(f"rsync did not finish within {COPY_TIMEOUT_S:.0f}s") from None
    if proc.returncode != 0:
        raise GpuclaimError(f"rsync: {_last_line(proc.stderr)}")


def _tar(root: Path, files: Sequence[str]) -> bytes:
    import tarfile  # only without rsync: not on every copy's path

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in files:
            tar.add(str(root / rel), arcname=rel, recursive=False)
    return buf.getvalue()


def _untar(data: bytes, into: Path) -> None:
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if member.name.startswith("/") or ".." in parts or member.isdev():
                raise GpuclaimError(f"refusing {member.name!r} from the node's tar stream")
            if (member.issym() or member.islnk()) and (
                member.linkname.startswith("/") or ".." in Path(member.linkname).parts
            ):
                raise GpuclaimError(f"refusing the link {member.name!r} -> {member.linkname!r}")
        tar.extractall(into)


def _copy_files(root: Path, files: Sequence[str], dest: Path) -> None:
    for rel in files:
        src, dst = root / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else "it failed and printed nothing"
