"""The structure holds: no import cycle, small modules and classes, a node side that needs
only the standard library, a bundle of exactly that, and one store interface served and
forwarded whole (docs/ARCHITECTURE.md). The layer order itself is import-linter's job
(pyproject.toml, run by .ci/run)."""

from __future__ import annotations

import ast
import inspect
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from gpuclaim.core.booking import Booking, EndedBooking
from gpuclaim.core.model import Claim, ClaimedGpu, Event, Job, JobUpdate
from gpuclaim.node.channel import LocalChannel
from gpuclaim.node.home import BOOT
from gpuclaim.remote.bundle import agent_bundle, agent_modules
from gpuclaim.remote.store_proxy import RemoteStore
from gpuclaim.store import STORE_METHODS, ClaimStore, Snapshot, Store

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpuclaim"
NODE_SIDE = ("core", "store", "engine", "node")
GENERATED_MARK = "do not edit"  # a generated module says so in its docstring


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path) -> set[str]:
    """Every gpuclaim module ``name`` imports, anywhere in the file (function-local too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_no_import_cycle_counting_function_local_imports() -> None:
    graph = {name: _imports(name, path) for name, path in MODULES.items()}
    # A package importing its own submodules (re-exports) is not a cycle of design.
    graph = {n: {d for d in deps if not d.startswith(n + ".")} for n, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_hand_written_module_over_600_lines_or_class_over_300() -> None:
    too_big = []
    for name, path in MODULES.items():
        text = path.read_text("utf-8")
        tree = ast.parse(text)
        if GENERATED_MARK in (ast.get_docstring(tree) or ""):
            continue
        if len(text.splitlines()) > 600:
            too_big.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                size = node.end_lineno - node.lineno + 1
                if size > 300:
                    too_big.append(f"{name}.{node.name}: {size} lines")
    assert not too_big, too_big


def test_no_function_over_80_lines() -> None:
    too_long = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text("utf-8"))
        if GENERATED_MARK in (ast.get_docstring(tree) or ""):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno:
                size = node.end_lineno - node.lineno + 1
                if size > 80:
                    too_long[f"{name}.{node.name}"] = size
    assert not too_long, too_long


def test_node_side_imports_under_isolated_python_without_site_packages() -> None:
    """What nodes run loads with ``python3 -I -S``: no third-party module comes along."""
    names = sorted(n for n in MODULES if n.split(".")[1:2] and n.split(".")[1] in NODE_SIDE)
    code = (
        "import sys, importlib\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "before = set(sys.modules)\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(loaded - set(sys.stdlib_module_names) - {'gpuclaim'}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout
    assert len(names) > 40  # every module of core, store, engine and node was imported


def _closure(entry: str) -> set[str]:
    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1))
        todo.extend(_imports(name, MODULES[name]) - seen)
    return seen


def test_agent_bundle_is_the_node_side_and_runs_alone(tmp_path: Path) -> None:
    modules = agent_modules()
    # The bundle reads imports with a regular expression (fast); ast must agree with it.
    expected = {MODULES[m].relative_to(PACKAGE).as_posix() for m in _closure("gpuclaim.node.main")}
    assert set(modules) == expected
    top = {m.split("/")[0] for m in modules if "/" in m}
    assert top <= set(NODE_SIDE), top  # nothing of cli, board, app, remote, entry, sim
    assert "node/main.py" in modules and "node/wrapper.py" in modules
    assert "engine/observe.py" not in modules  # a look at the cluster is the laptop's
    _, blob = agent_bundle()
    names = set(zipfile.ZipFile(io.BytesIO(blob)).namelist())
    sources = {f"gpuclaim/{m}" for m in modules} | {"__main__.py", "vendor/pynvml.py"}
    # ... and each one's bytecode for this Python where zipimport looks for it (a/b.pyc),
    # so a node of the same version imports from the one file and compiles nothing
    assert names == sources | {name + "c" for name in sources}
    # A node of this Python keeps the zip as one file; one of another unpacks the sources.
    (tmp_path / "agent-t.pyz").write_bytes(blob)
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        zf.extractall(tmp_path / "agent-t", [n for n in names if not n.endswith(".pyc")])
    for n, root in enumerate([tmp_path / "agent-t.pyz", tmp_path / "agent-t"]):
        request = json.dumps(
            {
                "op": "store",
                "root": str(tmp_path / f"s{n}"),
                "method": "ensure",
                "args": [],
                "kwargs": {"create": True},
            }
        )
        for argv in (["-c", BOOT, str(root)], [str(root)]):  # as gpuclaim starts it; by hand
            proc = subprocess.run(
                [sys.executable, "-I", "-S", "-X", "importtime", *argv],
                input=request,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert json.loads(proc.stdout) == {"result": None}, proc.stderr
            assert (tmp_path / f"s{n}" / "VERSION").is_file()
            imported = [line.split("|")[-1].strip() for line in proc.stderr.splitlines()]
            assert "zipfile" not in imported and "gpuclaim.node.main" in imported
            if argv[0] == "-c":
                assert "runpy" not in imported  # its imports cost every agent start


@pytest.fixture
def package_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A copy of the package that ``remote.bundle`` versions instead of this one (its
    caches cleared before and after), and a data dir of its own."""
    import shutil

    from gpuclaim.remote import bundle

    copy = tmp_path / "pkg" / "gpuclaim"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(bundle, "PACKAGE_DIR", copy)
    monkeypatch.setenv("GPUCLAIM_HOME", str(tmp_path / "home"))

    def fresh() -> str:  # as a new CLI process finds it
        bundle.agent_version.cache_clear()
        bundle._bundle_files.cache_clear()
        return bundle.agent_version()

    yield copy, fresh, tmp_path / "home" / "bundles" / "version.json"
    bundle.agent_version.cache_clear()
    bundle._bundle_files.cache_clear()


def test_the_agents_version_is_kept_and_follows_every_edit(package_copy: Any) -> None:
    """Each command that talks to a node names the agent's version; it is kept under a
    stamp of the sources (a stat each) instead of hashing the bundle every time, and an
    edit of a bundled file changes it, one of a file the nodes never get does not."""
    from gpuclaim.remote import bundle

    copy, fresh, memo = package_copy
    first = fresh()
    assert first == bundle._hashed_version() and memo.is_file()
    assert json.loads(memo.read_text())["version"] == first
    assert fresh() == first  # read back
    runner = copy / "node" / "runner.py"
    runner.write_text(runner.read_text() + "# an edit\n")
    edited = fresh()
    assert edited != first and edited == bundle._hashed_version()
    cli = copy / "cli" / "jobs.py"  # not on the node side
    cli.write_text(cli.read_text() + "# an edit\n")
    assert fresh() == edited
    memo.write_text("{not json")  # a damaged memo is only a slower call
    assert fresh() == edited and json.loads(memo.read_text())["version"] == edited
    import shutil

    shutil.rmtree(memo.parent)
    memo.parent.write_text("")  # a data dir it cannot write in (root too): still right
    assert fresh() == edited


def test_the_bundle_carries_nvml_bindings_for_nodes_without_them(tmp_path: Path) -> None:
    """A node with a driver but no nvidia-ml-py still reads NVML in-process (the copy the
    bundle carries); a node without the driver's library never imports that copy."""
    import pynvml

    _, blob = agent_bundle()
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        assert zf.read("vendor/pynvml.py") == Path(pynvml.__file__).read_bytes()
    (tmp_path / "agent.pyz").write_bytes(blob)  # as a node of this Python keeps it
    code = (
        f"import ctypes, sys\nsys.path.insert(0, {str(tmp_path / 'agent.pyz')!r})\n"
        "from gpuclaim.node.probe import nvml\n"
        "from gpuclaim.core.errors import ProbeError\n"
        "try:\n    nvml.bindings()\nexcept ProbeError as e:\n    print('without:', e)\n"
        "print('imported:', 'pynvml' in sys.modules)\n"
        "ctypes.CDLL = lambda name: None  # as if the driver's library loaded\n"
        "print('with:', nvml.bindings().__file__)\n"
        "try:\n    nvml.probe_nvml('n1')\nexcept ProbeError as e:\n    print('probe:', e)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 4, proc.stdout + proc.stderr
    assert lines[0].startswith("without: NVML library not found: libnvidia-ml.so.1")
    assert lines[1] == "imported: False"
    assert lines[2] == f"with: {tmp_path / 'agent.pyz' / 'vendor' / 'pynvml.pyc'}"  # bytecode
    assert lines[3].startswith("probe: NVML cannot start")


def test_the_store_interface_is_implemented_and_forwarded_whole() -> None:
    for name in STORE_METHODS:
        declared = inspect.signature(getattr(Store, name))
        implemented = inspect.signature(getattr(ClaimStore, name))
        assert list(declared.parameters) == list(implemented.parameters), name
        assert callable(getattr(RemoteStore, name)), name
    assert {"snapshot", "acquire", "update_job", "record_usage", "clock"} <= STORE_METHODS


class _JsonChannel:
    """The agent in this process, with the request and answer through JSON as on the wire."""

    def call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        return LocalChannel().call(op, json.loads(json.dumps(args)), timeout)


def test_positional_and_typed_calls_cross_the_remote_proxy(tmp_path: Path) -> None:
    remote = RemoteStore(_JsonChannel(), str(tmp_path / "store"))
    remote.ensure(True)  # positional
    now = round(remote.now(), 3)  # claims keep milliseconds
    claim = Claim(
        id="c-1",
        user="ann",
        host="laptop",
        pid=1,
        node="n1",
        gpus=(ClaimedGpu("GPU-a", 0),),
        since=now,
        expires=now + 60,
    )
    remote.acquire(claim)
    snap = remote.snapshot()
    assert isinstance(snap, Snapshot) and snap.claims["c-1"].claim == claim
    job = Job("j-1", "train", "ann", ("python", "t.py"), "queued", now, 60.0)
    job = remote.create_job(job)
    result = remote.update_job("j-1", {"state": "running"}, ["queued"])  # all positional
    assert isinstance(result, JobUpdate) and result.applied
    assert result.job == job.with_(state="running") == remote.load_job("j-1")
    assert remote.list_jobs() == [result.job]
    booking = Booking("r-1", "ann", "n1", (ClaimedGpu("GPU-b", 1),), now + 60, now + 120)
    remote.book(booking)
    assert remote.bookings() == [booking]
    assert remote.update_booking("r-1", {"used": now + 61}) == booking.marked_used(now + 61)
    ended = remote.end_booking("r-1", {"ended": now + 62, "ended_why": "cancelled", "by": "bo"})
    assert ended == EndedBooking(booking.marked_used(now + 61), now + 62, "cancelled", "bo")
    assert remote.ended_bookings() == [ended] and remote.bookings() == []
    array = {"id": "a-1", "name": "sweep", "user": "ann", "indices": [0, 1], "count": 2}
    remote.create_array(array)  # an ArrayRecord is a dict: it crosses as one
    assert remote.list_arrays() == [array] and remote.load_array("a-1") == array
    summary = {"count": 2, "gpu_hours": 1.5}
    assert remote.update_array("a-1", {"result": summary}) == {**array, "result": summary}
    remote.append_event(Event(ts=now, type="claim", user="ann"))
    events, bad = remote.read_events()
    assert bad == 0 and [e.type for e in events] == ["claim"]
    assert ClaimStore(tmp_path / "store").snapshot().claims["c-1"].claim == claim


def test_an_unknown_store_method_is_refused_by_the_agent(tmp_path: Path) -> None:
    remote = RemoteStore(_JsonChannel(), str(tmp_path / "store"))
    with pytest.raises(Exception, match="unknown store method '_p'"):
        remote.call("_p", "x")


def test_a_malformed_agent_request_is_an_error_answer_not_a_traceback() -> None:
    from gpuclaim.node.agent import handle

    answer = handle({"op": "probe"})  # no "node"
    assert answer["error"]["message"] == "agent: bad probe request: KeyError: 'node'"
    assert handle({"op": "nope"})["error"]["message"] == "agent: unknown op 'nope'"
