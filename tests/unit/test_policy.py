"""The lab's policy over a person's config (core/policy.py, store/policy.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuclaim.core.config import Config, parse_config
from gpuclaim.core.errors import ConfigError, UsageError
from gpuclaim.core.policy import checked_policy, key_value, with_policy
from gpuclaim.engine.policy import lab_config
from tests.unit.job_factory import new_store


def _config(**defaults: object) -> Config:
    return parse_config({"storage": "/tmp/x", "defaults": dict(defaults)})


def test_the_labs_values_hold_and_a_stricter_own_limit_stays() -> None:
    policy = checked_policy(
        {"defaults": {"max_gpus_per_user": 2}, "queue": {"preempt_grace": "5s"}}
    )
    loose = with_policy(_config(max_gpus_per_user=8), policy)
    assert loose.limits.max_gpus_per_user == 2 and loose.queue.preempt_grace_s == 5.0
    none = with_policy(_config(), policy)
    assert none.limits.max_gpus_per_user == 2
    strict = with_policy(_config(max_gpus_per_user=1), policy)
    assert strict.limits.max_gpus_per_user == 1


def test_a_bad_policy_key_or_value_is_one_error() -> None:
    with pytest.raises(ConfigError, match="not a lab policy key"):
        checked_policy({"defaults": {"storage": "/x"}})
    with pytest.raises(ConfigError):
        checked_policy({"defaults": {"max_time": "forever"}})
    with pytest.raises(UsageError, match="not a lab policy key"):
        key_value("defaults.nonsense", "1")
    assert key_value("max_gpus_per_user", "3") == ("defaults", "max_gpus_per_user", 3)
    assert key_value("queue.preempt_grace", "30s") == ("queue", "preempt_grace", "30s")


def test_the_stores_policy_applies_only_when_its_owner_alone_wrote_it(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = _config(max_gpus_per_user=8)
    store.set_policy({"defaults": {"max_gpus_per_user": 2}})
    assert store.policy() == {"defaults": {"max_gpus_per_user": 2}}
    assert lab_config(config, store).limits.max_gpus_per_user == 2
    os.chmod(store.root / "policy.json", 0o666)
    assert "may be written by others" in store.policy_problem() and store.policy() == {}
