"""Hostile input, property-based: each value is refused with a clear message or passes through
exactly; nothing crashes, nothing is injected, and --json always parses."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuclaim.core.config import parse_config
from gpuclaim.core.durations import parse_bytes, parse_duration
from gpuclaim.core.errors import ConfigError, UsageError
from gpuclaim.core.identity import validate_name

SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(st.text())
def test_durations_parse_or_refuse_clearly(text):
    try:
        seconds = parse_duration(text)
    except UsageError as exc:
        assert "\n" not in exc.message  # one line, whatever was typed (repr escapes it)
        return
    assert 0 < seconds <= 366 * 86400


@SETTINGS
@given(st.text() | st.from_regex(r"\A\d{1,4}(\.\d)? ?[kKmMgGtT]?(i?[bB])?\Z"))
def test_sizes_parse_or_refuse_clearly(text):
    try:
        size = parse_bytes(text)
    except UsageError as exc:
        assert "\n" not in exc.message and "4GiB" in exc.message
        return
    assert size >= 0


def test_sizes_read_as_rsync_reads_them():
    assert parse_bytes("4G") == parse_bytes("4GiB") == parse_bytes("4 gib") == 4 << 30
    assert parse_bytes("4GB") == 4 * 10**9 and parse_bytes("1.5M") == 3 << 19
    assert parse_bytes("123") == parse_bytes("123B") == 123 and parse_bytes("2T") == 2 << 40


@SETTINGS
@given(st.text())
def test_names_are_safe_or_refused(name):
    try:
        ok = validate_name(name, "job name")
    except UsageError as exc:
        assert "invalid job name" in exc.message
        return
    assert ok == name
    assert name.isascii() and "/" not in name and "." not in name and ":" not in name
    assert not name.startswith("-") and 1 <= len(name) <= 64


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(), children, max_size=3)
    ),
    max_leaves=8,
)


TOP_LEVEL_KEYS = [
    "cluster",
    "nodes",
    "storage",
    "user",
    "ssh_config",
    "defaults",
    "node",
    "slack",
    "idle",
    "agent_command",
    "bogus",
]


@SETTINGS
@given(
    st.dictionaries(
        st.sampled_from(TOP_LEVEL_KEYS),
        JSON_VALUES,
        max_size=5,
    )
)
def test_any_config_document_loads_or_is_refused_with_the_key(raw):
    try:
        parse_config(raw)
    except ConfigError as exc:
        message = exc.message
        assert message and "\n" not in message, message  # one line
        # ... naming what it refuses: a key the document has, at any depth (as 'key' or in a
        # dotted path 'node.n.key'), a top-level one it lacks, or the bad value itself
        names = _keys(raw) | set(TOP_LEVEL_KEYS)
        quoted = [f"'{k}'" for k in names] + [f"'{k}." for k in names] + [f".{k}'" for k in names]
        quoted += [repr(k) for k in names]  # a control character is shown escaped
        assert any(q in message for q in quoted), message


def _keys(value: object) -> set[str]:
    """Every key and string value in a document, at any depth."""
    if isinstance(value, dict):
        found = {str(k) for k in value}
        for child in value.values():
            found |= _keys(child)
        return found
    if isinstance(value, list):
        return set().union(*(_keys(v) for v in value)) if value else set()
    return {value} if isinstance(value, str) else set()


def _main(args: list[str]) -> tuple[int, str, str]:
    from gpuclaim.entry.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(note=st.text(max_size=250))
def test_notes_never_break_json_or_tables(make_cluster, note, tmp_path_factory):
    c = _shared_cluster(make_cluster)
    with _env(c):
        rc, out, err = _main(["claim", "-n", "1", "--note", note, "--json"])
        if rc != 0:
            assert rc == 2 and "--note is limited" in err
            return
        claim = json.loads(out)
        cleaned = "".join(ch if ch.isprintable() else " " for ch in note).strip()
        assert claim["note"] == cleaned
        rc, out, _ = _main(["status", "--json"])
        assert rc == 0
        assert any(r["claim"] and r["claim"]["note"] == cleaned for r in json.loads(out))
        rc, table, _ = _main(["status"])
        assert rc == 0 and "\x1b" not in table
        assert _main(["release", claim["id"]])[0] == 0


ARGS = st.lists(
    st.text(
        alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
        max_size=20,
    ),
    max_size=6,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(args=ARGS)
def test_job_arguments_arrive_exactly(make_cluster, args):
    c = _shared_cluster(make_cluster)
    marker = c.root / "injected"
    script = "import sys, json; print(json.dumps(sys.argv[1:]))"
    with _env(c):
        rc, out, err = _main(["run", "--json", "--", "python3", "-c", script, *args])
        assert rc == 0, err
        job = json.loads(out)
        deadline = time.monotonic() + 30
        while True:
            rc, out, _ = _main(["jobs", "--all", "--json"])
            state = next(j for j in json.loads(out) if j["id"] == job["id"])["state"]
            if state not in ("starting", "running"):
                break
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert state == "succeeded"
        rc, out, _ = _main(["logs", job["id"], "-n", "0"])
        assert json.loads(out.strip().splitlines()[-1]) == args
    assert not marker.exists()


_CLUSTER: list[object] = []  # [the test's make_cluster, its cluster]


def _shared_cluster(make_cluster):
    # one cluster per test function (hypothesis runs the body many times); the factory is
    # held, not its id(): an id can be reused by the next test's factory
    if not _CLUSTER or _CLUSTER[0] is not make_cluster:
        _CLUSTER[:] = [make_cluster, make_cluster({"node01": 2}, fast=True)]
    return _CLUSTER[1]


@contextlib.contextmanager
def _env(cluster):
    saved = dict(os.environ)
    os.environ.update(cluster.env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
