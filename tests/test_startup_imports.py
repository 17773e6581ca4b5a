"""What a call imports is what it uses: every module is milliseconds of every call's start.

A look with nothing queued, no service down, no lost job and no Slack imports no job
operations, no queue pass, no claims and no SSH head start (local nodes need none); a run
that starts at once and copies nothing imports no queue pass and no .gitignore parser."""

from __future__ import annotations

from typing import Any

from testbed_fixtures import looks_until_warm

PROBE = (
    "import sys\n"
    "from gpuclaim.entry.main import main\n"
    "code = main()\n"
    "sys.stderr.write('\\nMODULES ' + ' '.join(sorted(sys.modules)) + '\\n')\n"
    "sys.exit(code)\n"
)


def _modules(cluster: Any, *args: str) -> set[str]:
    proc = cluster.python(PROBE, *args)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stderr.rsplit("MODULES ", 1)[1].split())


def test_a_look_with_nothing_to_do_imports_only_the_look(cluster: Any) -> None:
    modules = _modules(cluster, "status", "--json")
    assert "gpuclaim.engine.cluster" in modules  # it did look
    unused = {
        "gpuclaim.engine.claims",
        "gpuclaim.engine.dispatch",
        "gpuclaim.engine.launch",
        "gpuclaim.engine.notify",
        "gpuclaim.engine.service_view",
        "gpuclaim.remote.early",
    }
    assert not modules & unused, sorted(modules & unused)


def test_a_run_that_starts_at_once_imports_no_queue_pass_nor_gitignore_parser(
    cluster: Any,
) -> None:
    modules = _modules(cluster, "run", "--", "true")
    assert "gpuclaim.engine.launch" in modules  # it did start a job
    assert not modules & {"gpuclaim.engine.dispatch", "pathspec"}


def test_a_first_remote_look_and_a_warm_one_pay_for_no_logging_hashing_or_archives(
    testbed: Any, make_remote: Any, runtime: Any
) -> None:
    """What the issue's itemised first call named, gone from a look over SSH: ``logging``
    (only ``--debug`` shows gpuclaim's messages), ``hashlib`` (OpenSSL), ``uuid`` (claim ids
    and nonces); and what only some looks need: ``socket`` (a warm agent to ask), ``csv``
    (CSV answers), ``shutil``'s archive modules (``which`` is all a look wanted)."""
    c = make_remote(testbed, nodes=["node01", "node02"])
    first = _modules(c, "status", "--json")
    assert "gpuclaim.remote.shell_look" in first  # the first contact's way: sh over SSH
    assert not first & {"logging", "hashlib", "_hashlib", "uuid", "socket", "csv"}, sorted(
        first & {"logging", "hashlib", "_hashlib", "uuid", "socket", "csv"}
    )
    looks_until_warm(c, runtime, 2)
    warm = _modules(c, "status", "--json")
    assert "socket" in warm  # it asked the warm agents
    unused = {"logging", "hashlib", "_hashlib", "uuid", "shutil", "bz2", "lzma", "csv"}
    assert not warm & unused, sorted(warm & unused)


def test_the_dataclasses_code_is_compiled_by_the_first_call_only(cluster: Any) -> None:
    """Python 3.9-3.12: the first call keeps the code ``@dataclass`` compiled; the next ones
    use it and write nothing; a torn file costs one compile, never a failed call."""
    import dataclasses
    import sys

    if not hasattr(dataclasses, "_create_fn"):  # 3.13+ compiles a class at once: no file
        cluster.ok("status")
        assert not (cluster.home / "cache").exists()
        return
    cluster.ok("status")
    (kept,) = (cluster.home / "cache").glob("dataclass-code-*.marshal")
    assert sys.implementation.cache_tag in kept.name
    before = kept.stat().st_mtime_ns, kept.stat().st_ino
    cluster.ok("status")
    assert (kept.stat().st_mtime_ns, kept.stat().st_ino) == before  # nothing new to keep
    cluster.ok("jobs")  # typer's commands make more classes (rich's too): kept besides
    grown = kept.stat().st_mtime_ns, kept.stat().st_ino
    cluster.ok("jobs")
    cluster.ok("status")
    assert (kept.stat().st_mtime_ns, kept.stat().st_ino) == grown
    kept.write_bytes(b"\x00torn")
    rows = cluster.status()
    assert len(rows) == 6 and {r["state"] for r in rows} == {"free"}
    assert kept.stat().st_size > 1000  # written whole again
