"""What ``run --sync`` copies from a project directory: the files git would consider part of
it (tracked, plus untracked ones that ``.gitignore`` does not exclude; never ``.git``), and
a refusal, naming the biggest paths, when that is more than a copy should be."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.durations import format_bytes
from gpuclaim.core.errors import GpuclaimError, UsageError
from gpuclaim.engine.sync import SyncPlan

if TYPE_CHECKING:  # imported where .gitignore patterns are read: ~12 ms of every run otherwise
    import pathspec

MAX_SYNC_BYTES = 1 << 30  # 1 GiB: data and checkpoints belong on shared storage, not in a copy


def plan_sync(
    root: Path, max_bytes: int = MAX_SYNC_BYTES, exclude: tuple[str, ...] = ()
) -> SyncPlan:
    """The files under ``root`` to copy, less ``exclude`` (.gitignore patterns: the project
    file's ``sync_exclude``)."""
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise UsageError(f"--sync {root}: {what}")
    root = root.absolute()
    listed = _git_files(root)
    files = listed if listed is not None else _walk(root)
    if exclude:
        import pathspec  # here: see TYPE_CHECKING above

        extra = pathspec.GitIgnoreSpec.from_lines(exclude)
        files = [f for f in files if not _excluded_by(extra, f)]
    sizes: dict[str, int] = {}
    for rel in files:
        try:
            st = (root / rel).lstat()
        except OSError:
            continue  # tracked but deleted: nothing to copy
        sizes[rel] = st.st_size
    total = sum(sizes.values())
    if total > max_bytes:
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        named = ", ".join(f"{p} ({format_bytes(n)})" for p, n in biggest)
        raise GpuclaimError(
            f"--sync would copy {format_bytes(total)} ({len(sizes)} files) to each node, more "
            f"than {format_bytes(max_bytes)}; the biggest: {named}",
            hint=(
                "list data and checkpoints in .gitignore (shared storage is the place for "
                'them), or allow more: sync_max = "4GiB" in gpuclaim.toml or the config\'s [run]'
            ),
        )
    listed = sorted(sizes)
    return SyncPlan(
        root=str(root), files=tuple(listed), size=total, left_out=_left_out(root, listed)
    )


def _left_out(root: Path, files: list[str]) -> tuple[str, ...]:
    """What is under ``root`` but not copied, as few paths as cover it: each entry of a
    directory that holds copied files which is neither copied nor such a directory itself
    (an ignored ``data/`` is one path, never walked). So rsync can walk the tree itself
    with these left out, instead of reading a list of every file (2x slower)."""
    listed = set(files)
    holding = {"/".join(f.split("/")[:i]) for f in files for i in range(1, f.count("/") + 1)}
    out: list[str] = []
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        try:
            entries = list(os.scandir(root / rel_dir if rel_dir else root))
        except OSError:
            continue
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if rel in listed:
                continue
            if rel in holding and entry.is_dir(follow_symlinks=False):
                pending.append(rel)
            else:
                out.append(rel)
    return tuple(sorted(out))


def _git_files(root: Path) -> Optional[list[str]]:
    """git's own answer, when ``root`` is in a work tree: exact .gitignore semantics (nested
    files, .git/info/exclude, the global excludes file)."""
    try:
        proc = subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None  # not a work tree (or no git): walk it
    names = [n.decode("utf-8", "surrogateescape") for n in proc.stdout.split(b"\0") if n]
    return [n for n in names if ".git" not in n.split("/")]


def _walk(root: Path) -> list[str]:
    """Every file under ``root`` but ``.git``, with each directory's ``.gitignore`` applied
    to what is below it, as git does."""
    import pathspec  # here: see TYPE_CHECKING above

    found: list[str] = []
    specs: list[tuple[str, pathspec.PathSpec[Any]]] = []
    for directory, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        specs = [(base, spec) for base, spec in specs if rel_dir.startswith(base)]
        ignore = Path(directory) / ".gitignore"
        if ignore.is_file():
            lines = ignore.read_text("utf-8", "replace").splitlines()
            specs.append((rel_dir, pathspec.GitIgnoreSpec.from_lines(lines)))

        dirs[:] = [d for d in dirs if d != ".git" and not _ignored(specs, rel_dir + d + "/")]
        found.extend(rel_dir + f for f in files if not _ignored(specs, rel_dir + f))
    return found


def _ignored(specs: list[tuple[str, pathspec.PathSpec[Any]]], rel: str) -> bool:
    """Whether a .gitignore above ``rel`` (a directory ends with "/") excludes it."""
    return any(spec.match_file(rel[len(base) :]) for base, spec in specs)


def _excluded_by(spec: pathspec.PathSpec[Any], rel: str) -> bool:
    """``rel`` or a directory above it matches (a pattern ``wandb/`` takes all below it)."""
    parts = rel.split("/")
    return spec.match_file(rel) or any(
        spec.match_file("/".join(parts[:i]) + "/") for i in range(1, len(parts))
    )
