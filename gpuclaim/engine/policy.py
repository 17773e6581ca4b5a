"""The config a decision is made with: this process's, with the lab's policy from the store
over it (``core/policy.py``), so that a keeper started under an older config, or a person
whose config says otherwise, holds the same limits as everyone.

Standard library only: keepers and wrappers decide on the nodes."""

from __future__ import annotations

import json
import time
from typing import Any

from gpuclaim.core.config import Config
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.policy import with_policy
from gpuclaim.store import Store

POLICY_FRESH_S = 1.0  # a policy read this recent stands (a decision loop reads it once)

_read: dict[tuple[int, str], tuple[float, dict[str, Any]]] = {}  # store -> (when, policy)
_merged: dict[tuple[int, str], Config] = {}


def lab_config(config: Config, store: Store) -> Config:
    """``config`` under the lab's policy (the config itself when the lab sets none, or the
    store cannot say: a decision is not refused for it)."""
    now = time.monotonic()
    which = (id(store), str(store.root))
    seen = _read.get(which)
    if seen is None or now - seen[0] > POLICY_FRESH_S:
        try:
            seen = (now, store.policy())
        except (GpuclaimError, AttributeError):  # an older agent serving ssh:// storage
            seen = (now, {})
        _read[which] = seen
    policy = seen[1]
    if not policy:
        return config
    key = (id(config), json.dumps(policy, sort_keys=True))
    merged = _merged.get(key)
    if merged is None:
        if len(_merged) > 64:
            _merged.clear()
        merged = _merged[key] = with_policy(config, policy)
    return merged
