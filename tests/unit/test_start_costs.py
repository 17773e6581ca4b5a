"""What a call's start no longer pays, each with the same result as what it replaces: the
dataclasses' code kept compiled (entry.dataclass_code), digests without OpenSSL
(core.digests), ``which`` without ``shutil`` (core.paths), debug logging without ``logging``
(core.lazylog)."""

from __future__ import annotations

import dataclasses
import hashlib
import marshal
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuclaim.core import lazylog
from gpuclaim.core.digests import sha1_hex, sha256
from gpuclaim.core.paths import which
from gpuclaim.entry import dataclass_code

_SOURCE = "def __create_fn__():\n def f(x):\n  return x + 1\n return f"


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> Any:
    """dataclass_code with state of its own, its exec routed for this test only."""
    monkeypatch.setattr(dataclass_code, "_codes", {})
    monkeypatch.setattr(dataclass_code, "_used", set())
    monkeypatch.setattr(dataclass_code, "_compiled", 0)
    monkeypatch.setattr(dataclasses, "exec", dataclass_code.cached_exec, raising=False)
    return dataclass_code


def _made(source: str) -> Any:
    ns: dict[str, Any] = {}
    dataclass_code.cached_exec(source, {}, ns)
    return ns["__create_fn__"]()


def test_a_text_is_compiled_once_and_its_code_runs_the_same(kept: Any) -> None:
    assert _made(_SOURCE)(1) == 2 and kept._compiled == 1
    assert _made(_SOURCE)(41) == 42 and kept._compiled == 1  # the kept code, no compile
    code = compile("y = 3", "<string>", "exec")  # code given as code: run as it is
    ns: dict[str, Any] = {}
    kept.cached_exec(code, {}, ns)
    assert ns["y"] == 3 and kept._compiled == 1


def test_kept_code_makes_the_same_frozen_dataclass(kept: Any, tmp_path: Path) -> None:
    def make() -> Any:
        @dataclasses.dataclass(frozen=True)
        class Point:
            x: int
            y: int = 0

        return Point

    first = make()
    compiled = kept._compiled
    assert compiled >= 4  # __init__, __repr__, __eq__, __hash__, __setattr__, __delattr__
    kept.save(tmp_path / "codes.marshal")
    kept._codes.clear()
    kept._codes.update(kept.load(tmp_path / "codes.marshal"))
    second = make()
    assert kept._compiled == compiled  # every function from the file
    for cls in (first, second):
        p = cls(1, 2)
        assert p == cls(1, 2) and p != cls(2, 1) and hash(p) == hash(cls(1, 2))
        assert repr(p).endswith("Point(x=1, y=2)") and cls(5).y == 0
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.x = 3  # type: ignore[misc]


def test_a_torn_or_foreign_file_is_no_code(tmp_path: Path) -> None:
    path = tmp_path / "codes.marshal"
    assert dataclass_code.load(path) == {}  # missing
    code = compile("pass", "<string>", "exec")
    for content in (
        b"\x00garbage",
        marshal.dumps((dataclass_code.FORMAT,))[:-1],
        marshal.dumps(["not", "a", "tuple"]),
        marshal.dumps((dataclass_code.FORMAT + 1, {"pass": code})),
        marshal.dumps((dataclass_code.FORMAT, ["pass"])),
    ):
        path.write_bytes(content)
        assert dataclass_code.load(path) == {}, content
    path.write_bytes(marshal.dumps((dataclass_code.FORMAT, {"pass": code, "x": "not code"})))
    assert list(dataclass_code.load(path)) == ["pass"]


def test_the_file_is_written_only_after_a_compile_and_pruned_past_its_limit(
    kept: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache" / "codes.marshal"
    kept.save(path)
    assert not path.exists()  # nothing compiled: nothing to keep
    for i in range(5):
        kept._codes[f"x = {i}"] = compile(f"x = {i}", "<string>", "exec")
    monkeypatch.setattr(dataclass_code, "KEEP_AT_MOST", 3)
    _made(_SOURCE)
    kept.save(path)
    assert list(kept.load(path)) == [_SOURCE]  # past the limit: what this process used
    assert path.parent.stat().st_mode & 0o077 == 0
    assert [p.name for p in path.parent.iterdir()] == ["codes.marshal"]  # no temporary left


def test_install_routes_dataclasses_exec_once(
    kept: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(dataclasses, "exec")
    registered: list[Any] = []
    monkeypatch.setattr(dataclass_code.atexit, "register", lambda f, *a: registered.append(a))
    expected = hasattr(dataclasses, "_create_fn")  # 3.9-3.12
    assert dataclass_code.install(tmp_path) is expected
    assert dataclass_code.install(tmp_path) is False  # the second: already routed
    assert registered == ([(dataclass_code.cache_file(tmp_path),)] if expected else [])
    assert sys.implementation.cache_tag in dataclass_code.cache_file(tmp_path).name


def test_digests_are_hashlibs() -> None:
    for data in (b"", b"node01\0/etc/ssh_config", os.urandom(1000)):
        assert sha1_hex(data) == hashlib.sha1(data).hexdigest()
        digest = sha256()
        digest.update(data)
        digest.update(b"more")
        assert digest.hexdigest() == hashlib.sha256(data + b"more").hexdigest()


def test_which_finds_what_shutil_finds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        d.mkdir()
    (first / "tool").write_text("")  # not executable: skipped
    (second / "tool").write_text("#!/bin/sh\n")
    (second / "tool").chmod(0o755)
    (first / "adir").mkdir()  # a directory of that name: skipped
    monkeypatch.setenv("PATH", f"{first}:{second}")
    for name in ("tool", "adir", "missing"):
        assert which(name) == shutil.which(name), name
    assert which("tool") == str(second / "tool")


def test_debug_logs_nothing_and_imports_nothing_until_logging_is_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger = lazylog.get_logger("gpuclaim.test")
    logging = sys.modules["logging"]  # pytest has it: take it away as a first call has none
    monkeypatch.delitem(sys.modules, "logging")
    logger.debug("dropped %s", "quietly")
    assert logger._logger is None and "logging" not in sys.modules
    monkeypatch.setitem(sys.modules, "logging", logging)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: Any) -> None:
            records.append(record.getMessage())

    real = logging.getLogger("gpuclaim.test")
    handler = Keep()
    real.addHandler(handler)
    monkeypatch.setattr(real, "level", logging.DEBUG)
    try:
        logger.debug("shown %s", "now")
    finally:
        real.removeHandler(handler)
    assert records == ["shown now"]


def test_libraries_logging_gets_its_null_handler_when_it_is_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logging = sys.modules["logging"]
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "logging")
    lazylog.quiet_libraries_logging()
    lazylog.quiet_libraries_logging()  # twice: one finder
    finders = [f for f in sys.meta_path if isinstance(f, lazylog._QuietWhenImported)]
    assert len(finders) == 1
    try:
        fresh = __import__("logging")
        assert fresh is not logging
        assert any(isinstance(h, fresh.NullHandler) for h in fresh.getLogger().handlers)
        assert finders[0].used  # and finds nothing more: sys.meta_path is never edited
        assert finders[0].find_spec("logging", None) is None
    finally:
        sys.modules["logging"] = logging  # the one every other module holds
