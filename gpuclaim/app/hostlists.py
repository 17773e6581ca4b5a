"""Node lists written as ranges, ``node[01-04]`` or ``gpu[1,3,5-6]``, expanded as pdsh and
SLURM do, by ``python-hostlist`` (numeric ranges only, as theirs: ``gpu-[a,c]`` is refused).
The laptop expands them; nodes only ever see the names (they parse the config as JSON)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Optional

from gpuclaim.core.errors import ConfigError, UsageError


def expand(text: str) -> list[str]:
    """``node[01-02]`` -> ``["node01", "node02"]``; raises hostlist.BadHostlist."""
    import hostlist  # here, as below: only a name with a range needs it (~1 ms of a call)

    return list(hostlist.expand_hostlist(text, allow_duplicates=True))


def expand_config_nodes(raw: dict[str, Any]) -> dict[str, Any]:
    """The config's ``nodes`` with every range expanded, in order (a name listed twice stays
    twice, for the config's own check to name); a malformed range names the key."""
    nodes = raw.get("nodes")
    if not isinstance(nodes, list) or not any(_ranged(n) for n in nodes):
        return raw
    import hostlist

    names: list[Any] = []
    for item in nodes:
        if not _ranged(item):
            names.append(item)
            continue
        try:
            names.extend(expand(item.strip()))
        except hostlist.BadHostlist as exc:
            raise ConfigError(
                f"'nodes': {item!r} is not a host range like \"node[01-04]\" ({exc})"
            ) from None
    return {**raw, "nodes": names}


def _ranged(item: Any) -> bool:
    return isinstance(item, str) and ("[" in item or "]" in item)


def node_names(values: Iterable[str], flag: str = "--node") -> list[str]:
    """Each value of a repeatable ``--node``, its ranges expanded."""
    names: list[str] = []
    for value in values:
        for name in _expanded(value, flag):
            if name not in names:
                names.append(name)
    return names


def one_node(value: Optional[str], flag: str = "--node") -> Optional[str]:
    """A ``--node`` that pins one node: a range is fine if it names exactly one."""
    if value is None or ("[" not in value and "," not in value):
        return value
    names = _expanded(value, flag)
    if len(names) != 1:
        raise UsageError(
            f"{flag} pins one node; {value!r} names {len(names)}: leave {flag} out to let "
            "gpuclaim pick among all nodes"
        )
    return names[0]


def _expanded(value: str, flag: str) -> list[str]:
    import hostlist

    try:
        names = expand(value.strip())
    except hostlist.BadHostlist as exc:
        raise UsageError(
            f"{flag} {value!r} is not a node name or range like node[01-02] ({exc})"
        ) from None
    if not names:
        raise UsageError(f"{flag} wants a node name")
    return names
