"""States are types: outside ``core/states.py`` (and the simulators, which play a GPU and
speak the wire), no string literal in ``gpuclaim/`` equals a GPU, face or job state. A word
that is spelled like a state but means something else is named below with what it means."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuclaim.core.states import FaceState, GpuState, JobState

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpuclaim"
STATE_WORDS = {s.value for s in (*GpuState, *FaceState, *JobState)}
EXEMPT_FILES = {"gpuclaim/core/states.py"}
EXEMPT_DIRS = ("gpuclaim/sim/",)

# (module path, word): what the word means there. Keep it short: each is a reviewed exception.
NOT_A_STATE: dict[tuple[str, str], str] = {
    ("gpuclaim/core/config.py", "timeout"): "the [slack] key: seconds a post may take",
    ("gpuclaim/core/protocol.py", "timeout"): "the probe request's field: seconds it may take",
    ("gpuclaim/remote/shell_look.py", "timeout"): "the probe request's field, read for sh",
    ("gpuclaim/node/agent.py", "timeout"): "the probe request's field, read on the node",
    ("gpuclaim/node/recent_reads.py", "timeout"): "the probe request's field: how long to share",
}


def _state_literals() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in EXEMPT_FILES or rel.startswith(EXEMPT_DIRS):
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Constant) and node.value in STATE_WORDS:
                found.setdefault((rel, str(node.value)), []).append(node.lineno)
    return found


def test_no_state_literal_outside_core_states() -> None:
    literals = _state_literals()
    left = {
        f"{path}:{lines}: {word!r}"
        for (path, word), lines in literals.items()
        if (path, word) not in NOT_A_STATE
    }
    assert not left, "use JobState / GpuState / FaceState:\n" + "\n".join(sorted(left))


def test_every_exception_is_still_needed() -> None:
    literals = _state_literals()
    stale = [key for key in NOT_A_STATE if key not in literals]
    assert not stale, f"no longer spelled there, take them off NOT_A_STATE: {stale}"


def test_the_walk_finds_a_literal() -> None:
    """The walk itself works: a module holding a state literal is seen."""
    tree = ast.parse('if job.state == "queued":\n    pass\n')
    words = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    assert [w for w in words if w in STATE_WORDS] == ["queued"]
