"""The kept login environment (node/login_cache.py): keyed by the shell, the stable part of
the environment and the profiles' stamps; what the shell changed is applied to a new base."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuclaim.node import login_cache


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".profile").write_text("export A=1\n")
    return tmp_path


BASE = {"PATH": "/usr/bin", "HOME": "/h", "TMUX_PANE": "%1", "DROPPED": "x"}


def test_a_kept_result_applies_to_the_next_base(home: Path) -> None:
    key = login_cache.cache_key(BASE, "/bin/bash")
    result = {"PATH": "/h/.local/bin:/usr/bin", "HOME": "/h", "TMUX_PANE": "%1", "A": "1"}
    login_cache.save(key, BASE, result)
    later = {**BASE, "TMUX_PANE": "%7"}  # another tmux session: the same key
    assert login_cache.cache_key(later, "/bin/bash") == key
    env = login_cache.load(key, later)
    assert env == {"PATH": "/h/.local/bin:/usr/bin", "HOME": "/h", "TMUX_PANE": "%7", "A": "1"}
    kept = login_cache.cache_dir() / f"{key}.json"
    assert kept.stat().st_mode & 0o777 == 0o600


def test_an_edited_profile_or_another_shell_or_base_is_another_key(home: Path) -> None:
    key = login_cache.cache_key(BASE, "/bin/bash")
    assert login_cache.cache_key(BASE, "/bin/zsh") != key
    assert login_cache.cache_key({**BASE, "LANG": "C"}, "/bin/bash") != key
    (home / ".profile").write_text("export A=2\n")
    assert login_cache.cache_key(BASE, "/bin/bash") != key
    (home / ".bashrc").write_text("# new\n")  # a profile that was not there
    assert login_cache.cache_key(BASE, "/bin/bash") != key


def test_a_day_old_or_damaged_result_is_not_used(home: Path) -> None:
    key = login_cache.cache_key(BASE, "/bin/bash")
    login_cache.save(key, BASE, {**BASE, "A": "1"})
    kept = login_cache.cache_dir() / f"{key}.json"
    old = time.time() - login_cache.MAX_AGE_S - 5
    os.utime(kept, (old, old))
    assert login_cache.load(key, BASE) is None
    kept.write_text("{not json")
    assert login_cache.load(key, BASE) is None
