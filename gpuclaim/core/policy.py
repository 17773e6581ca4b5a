"""The lab's policy: limits, queue weights, the preemption grace and the idle policy kept in
the store (``policy.json``, written by whoever owns the store's directory), so that every
person's CLI, queue keeper and job wrapper applies the same, whatever config each started
with. A person's own config may only be stricter (a smaller limit) in their own processes.

Standard library only: keepers and wrappers apply it on the nodes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from gpuclaim.core.config import Config, parse_config
from gpuclaim.core.errors import ConfigError, UsageError

# What the lab decides, by config table: the same keys, spelled as in a config file.
POLICY_KEYS: dict[str, frozenset[str]] = {
    "defaults": frozenset(
        {
            "max_gpus_per_user",
            "max_queued_per_user",
            "max_time",
            "max_service_time",
            "max_reservation",
            "max_reserved_gpu_hours",
        }
    ),
    "queue": frozenset({"half_life", "max_age", "fairshare_weight", "age_weight", "preempt_grace"}),
    "idle": frozenset({"window", "threshold_pct", "warn", "release_after", "release_jobs"}),
}
_LIMITS = frozenset({"max_gpus_per_user", "max_queued_per_user"})  # a count; 0 = no limit


def checked_policy(policy: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The policy, validated as a config's tables would be (ConfigError naming the key)."""
    tables: dict[str, dict[str, Any]] = {}
    for table, values in policy.items():
        allowed = POLICY_KEYS.get(table)
        if allowed is None or not isinstance(values, dict):
            raise ConfigError(f"the lab policy has no table {table!r} ({', '.join(POLICY_KEYS)})")
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise ConfigError(
                f"{table}.{unknown[0]} is not a lab policy key "
                f"(in [{table}]: {', '.join(sorted(allowed))})"
            )
        tables[table] = dict(values)
    parse_config({"storage": "/", **tables})  # each value as the config's parser takes it
    return tables


def key_value(key: str, text: str) -> tuple[str, str, Any]:
    """``policy set TABLE.KEY VALUE``: the table, the key and the value (TOML's types: a
    number, true/false, else the text)."""
    table, _, name = key.partition(".")
    if not name:
        table, name = next(((t, key) for t, keys in POLICY_KEYS.items() if key in keys), ("", key))
    if table not in POLICY_KEYS or name not in POLICY_KEYS[table]:
        every = ", ".join(f"{t}.{k}" for t in POLICY_KEYS for k in sorted(POLICY_KEYS[t]))
        raise UsageError(f"{key!r} is not a lab policy key: {every}")
    value: Any
    try:
        value = json.loads(text)
    except ValueError:
        value = text
    if isinstance(value, (dict, list)) or value is None:
        value = text
    return table, name, value


def with_policy(config: Config, policy: dict[str, Any]) -> Config:
    """The config as the lab's policy has it: the policy's value for every key it sets,
    except a limit this config sets stricter (smaller), which holds in this process."""
    if not policy:
        return config
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.raw.items()}
    for table, values in policy.items():
        mine = raw.setdefault(table, {})
        for key, value in values.items():
            own = mine.get(key)
            if key in _LIMITS and _stricter(own, value):
                continue
            mine[key] = value
    try:
        merged = parse_config(raw, config.path)
    except ConfigError:
        return config  # a policy this version cannot read: the config as it is
    return replace(merged, warnings=config.warnings)


def _stricter(own: Any, lab: Any) -> bool:
    if not isinstance(own, int) or isinstance(own, bool) or own <= 0:
        return False
    return not isinstance(lab, int) or lab <= 0 or own < lab
