"""Where completion's values come from: node names from the config file, and claim ids, job
names and users from a small cache in the data dir that commands fill with what they saw
(``remember``). Also the typer ``autocompletion=`` callbacks (``complete_nodes`` and the
others), which mark a parameter's kind for the generated spec. Standard library only: the
fast path (``completion_answer.py``) reads these values on every TAB.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Callable, Optional

CACHE_VERSION = 1
CACHE_LIMIT = 100  # values kept per kind and cluster
CACHE_CLUSTERS = 8  # configs remembered (the demo, the real cluster, a test one...)


def config_file(explicit: Optional[str] = None) -> Optional[Path]:
    """The config file a command would load (``--config``, ``$GPUCLAIM_CONFIG``, the user's);
    None when there is none (local mode)."""
    from gpuclaim.core import paths

    path = Path(explicit).expanduser() if explicit else paths.config_path()
    return path if path.is_file() else None


def cache_key(config_path: Optional[Path]) -> str:
    """One cache section per config: the demo's jobs are not the lab's."""
    if config_path is None:
        return "local"
    try:
        return str(config_path.expanduser().resolve())
    except OSError:
        return str(config_path)


def node_values(config: Optional[str]) -> list[tuple[str, str]]:
    """Node names straight from the config file (no SSH), described by the last status."""
    path = config_file(config)
    if path is None and (config or os.environ.get("GPUCLAIM_CONFIG")):
        return []  # a config named but missing: the command itself will say so
    section = _section(path)
    names = ["localhost"] if path is None else _config_nodes(path, section)
    seen = dict(_pairs(section, "nodes"))
    return [(n, seen.get(n, "")) for n in names if n]


def _config_nodes(path: Path, section: Mapping[str, Any]) -> list[str]:
    """The config's ``nodes``; kept in the cache with the file's size and mtime, because
    importing a TOML parser costs more than all the rest of a completion."""
    st = path.stat()
    stamp = [(f"{st.st_mtime_ns}:{st.st_size}", "")]
    if _pairs(section, "config_stamp") == stamp:
        return [name for name, _ in _pairs(section, "config_nodes")]
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    listed = raw.get("nodes", ["localhost"])
    names = [n.strip() for n in listed if isinstance(n, str)] if isinstance(listed, list) else []
    remember(path, replace={"config_stamp": stamp, "config_nodes": [(n, "") for n in names if n]})
    return names


def _cached_values(kind: str) -> Callable[[Optional[str]], list[tuple[str, str]]]:
    def values(config: Optional[str]) -> list[tuple[str, str]]:
        return _pairs(_section(config_file(config)), kind)

    values.__name__ = f"{kind}_values"
    return values


def grouping_values(config: Optional[str]) -> list[tuple[str, str]]:
    return [("user", ""), ("node", ""), ("day", "")]  # history --by (history.GROUPINGS)


def signal_values(config: Optional[str]) -> list[tuple[str, str]]:
    from gpuclaim.core.model import PREEMPT_SIGNALS  # run --preempt-signal

    return [(s, "the default" if s == "USR1" else "") for s in PREEMPT_SIGNALS]


SOURCES: dict[str, Callable[[Optional[str]], list[tuple[str, str]]]] = {
    "nodes": node_values,
    "jobs": _cached_values("jobs"),
    "claims": _cached_values("claims"),
    "reservations": _cached_values("reservations"),
    "users": _cached_values("users"),
    "groupings": grouping_values,
    "signals": signal_values,
}


def cache_path() -> Path:
    from gpuclaim.core import paths

    return paths.data_dir() / "completion-cache.json"


def _read_cache() -> dict[str, Any]:
    import json

    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    clusters = data.get("clusters")
    return clusters if isinstance(clusters, dict) else {}


def _section(config_path: Optional[Path]) -> dict[str, Any]:
    section = _read_cache().get(cache_key(config_path), {})
    return section if isinstance(section, dict) else {}


def _pairs(section: Mapping[str, Any], kind: str) -> list[tuple[str, str]]:
    pairs = section.get(kind, [])
    return [
        (p[0], str(p[1]))
        for p in (pairs if isinstance(pairs, list) else [])
        if isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
    ]


def remember(
    config_path: Optional[Path],
    *,
    replace: Optional[Mapping[str, Iterable[tuple[str, str]]]] = None,
    add: Optional[Mapping[str, Iterable[tuple[str, str]]]] = None,
    remove: Optional[Mapping[str, Iterable[str]]] = None,
) -> None:
    """Note values a command has just seen, for completion: ``replace`` a kind with all there
    is, ``add`` new ones (first), ``remove`` gone ones. Never fails the command: a cache that
    cannot be written only makes completion offer less."""
    import json

    try:
        clusters = _read_cache()
        key = cache_key(config_path)
        section = clusters.pop(key, None)
        if not isinstance(section, dict):
            section = {}
        for kind, pairs in (replace or {}).items():
            section[kind] = _unique(list(pairs))
        for kind, pairs in (add or {}).items():
            section[kind] = _unique(list(pairs) + _pairs(section, kind))
        for kind, values in (remove or {}).items():
            gone = set(values)
            section[kind] = [[v, h] for v, h in _pairs(section, kind) if v not in gone]
        clusters[key] = section  # the most recent last: the oldest config goes first
        while len(clusters) > CACHE_CLUSTERS:
            clusters.pop(next(iter(clusters)))
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "clusters": clusters}), "utf-8")
        tmp.replace(path)  # readers see the old file or the new one, never half of one
    except OSError:
        pass


def _unique(pairs: list[tuple[str, str]]) -> list[list[str]]:
    seen: set[str] = set()
    kept = []
    for value, help_ in pairs:
        if value not in seen:
            seen.add(value)
            kept.append([value, help_])
    return kept[:CACHE_LIMIT]


def claim_item(claim: Any) -> tuple[str, str]:
    """A claim as completion shows it: its id, described by holder, GPUs and note."""
    gpus = ",".join(claim.labels)
    what = claim.note or (f"job {claim.job}" if claim.job else "")
    return claim.id, " · ".join(x for x in (claim.user, f"{claim.node} GPU {gpus}", what) if x)


def booking_item(booking: Any) -> tuple[str, str]:
    """A booking as completion shows it: its id, by owner, GPUs and note."""
    gpus = ",".join(booking.labels)
    parts = (booking.user, f"{booking.node} GPU {gpus}", booking.note)
    return booking.id, " · ".join(x for x in parts if x)


def job_item(job: Mapping[str, Any]) -> tuple[str, str]:
    """A job (its ``to_dict()``) as completion shows it."""
    where = f" on {job['node']}" if job.get("node") else ""
    return str(job["name"]), f"{job.get('user', '')} · {job.get('state', '')}{where}"


def remember_view(config_path: Optional[Path], view: Any) -> None:
    """After ``status`` of every node: the claims held now, their holders, the nodes."""
    from gpuclaim.core.states import GpuState

    claims = {r.claim.id: r.claim for r in view.rows if r.claim is not None}
    nodes: dict[str, list[str]] = {}
    for r in view.rows:
        if r.index is not None:
            nodes.setdefault(r.node, []).append(r.state)
    described = [
        (name, f"{states.count(GpuState.FREE)}/{len(states)} GPUs free")
        for name, states in nodes.items()
    ]
    described += [
        (name, GpuState.UNREACHABLE.value) for name in view.unreachable if name not in nodes
    ]
    remember(
        config_path,
        replace={"claims": [claim_item(c) for c in claims.values()], "nodes": described},
        add={"users": [(c.user, "") for c in claims.values()]},
    )


# -- the typer side -----------------------------------------------------------------------------


def _typer_completer(kind: str) -> Callable[..., list[tuple[str, str]]]:
    """An ``autocompletion=`` callback for typer: marks the parameter's kind for the spec, and
    answers with the same values when click itself drives completion."""

    def completer(ctx: Any, incomplete: str) -> list[tuple[str, str]]:
        root = ctx.find_root() if ctx is not None else None
        config = root.params.get("config") if root is not None else None
        return [
            (v, h)
            for v, h in SOURCES[kind](str(config) if config else None)
            if v.startswith(incomplete)
        ]

    completer.__name__ = f"complete_{kind}"
    COMPLETER_KINDS[completer] = kind
    return completer


COMPLETER_KINDS: dict[Callable[..., Any], str] = {}
complete_nodes = _typer_completer("nodes")
complete_jobs = _typer_completer("jobs")
complete_claims = _typer_completer("claims")
complete_reservations = _typer_completer("reservations")
complete_users = _typer_completer("users")
complete_groupings = _typer_completer("groupings")
complete_signals = _typer_completer("signals")
