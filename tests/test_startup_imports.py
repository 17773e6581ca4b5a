"""What a call imports is what it uses: every module is milliseconds of every call's start.

A look with nothing queued, no service down, no lost job and no Slack imports no job
operations, no queue pass, no claims and no SSH head start (local nodes need none); a run
that starts at once and copies nothing imports no queue pass and no .gitignore parser."""

from __future__ import annotations

from typing import Any

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
