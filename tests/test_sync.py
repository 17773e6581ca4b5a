"""[workenv] ``run --sync`` and ``pull`` through the CLI on the sshd testbed: the project's
files reach every node of the job as .gitignore says, each job keeps its own copy (made
incrementally), and what a job wrote comes back."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_reserve import _wait_until

from gpuclaim.core.model import parse_iso

# Lists what the job sees in its directory (relative paths, sorted) and reads one file.
LIST = (
    "import json, os\n"
    "found = sorted(os.path.relpath(os.path.join(d, f), '.') for d, _, fs in os.walk('.') "
    "for f in fs)\n"
    "print(json.dumps({'cwd': os.getcwd(), 'files': found, "
    "'v': open('v.txt').read() if os.path.exists('v.txt') else None}))\n"
)
# rsync reads what it leaves out as patterns: wildcards and backslashes must stay literal
ODD = [
    "with space.py",
    "quo'te\".txt",
    "ünï ✓.txt",
    "sub dir/deep/x.cfg",
    "wild[1]*?.py",
    "back\\slash.py",
]
# ignored names an unescaped pattern would not match (so they would be copied)
ODD_IGNORED = ["odd[1]*.ckpt", "back\\sl[a]sh.ckpt", "sub dir/x*?.ckpt"]


def _project(root: Path, git: bool = True) -> Path:
    root.mkdir(parents=True)
    (root / "list.py").write_text(LIST)
    (root / "v.txt").write_text("one")
    for name in ODD:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / ".gitignore").write_text("*.ckpt\ndata/\n")
    (root / "model.ckpt").write_text("big")
    for name in ODD_IGNORED:
        (root / name).write_text("ignored")
    (root / "data").mkdir()
    (root / "data" / "set.bin").write_text("data")
    (root / "sub dir" / ".gitignore").write_text("local.tmp\n")
    (root / "sub dir" / "local.tmp").write_text("scratch")
    if git:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        subprocess.run(["git", "-C", str(root), "add", "list.py", "v.txt"], check=True)
    return root


EXPECTED = sorted([".gitignore", "list.py", "v.txt", "sub dir/.gitignore", *ODD])


def _job(c, name):
    return next(r for r in c.json("jobs", "--all") if r["name"] == name)


def _wait(c, name, timeout=40.0):
    deadline = time.monotonic() + timeout
    while True:
        job = _job(c, name)
        if job["state"] in ("succeeded", "failed", "killed", "timeout", "lost"):
            return job
        assert time.monotonic() < deadline, f"{name} stuck in {job['state']}"
        time.sleep(0.3)


def _listed(c, name):
    job = _wait(c, name)
    log = c.ok("logs", name, "-n", "0")
    assert job["state"] == "succeeded", (job, log)
    return json.loads(log.strip().splitlines()[-1])


@pytest.fixture
def c(testbed, make_remote):
    return make_remote(testbed, kill_grace="2s", heartbeat="1s")


@pytest.mark.parametrize("git", [True, False], ids=["git", "no-git"])
def test_sync_copies_the_project_as_gitignore_says_and_runs_in_the_copy(c, tmp_path, git):
    project = _project(tmp_path / "proj", git=git)
    proc = c.cli(
        "run",
        "--node",
        "node01",
        "--name",
        "s1",
        "--sync",
        "--json",
        "--",
        "python3",
        "list.py",
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    listed = _listed(c, "s1")
    assert listed["files"] == EXPECTED  # names intact; no .git, no ignored files
    home = c.testbed.node_dir("node01") / "home"
    job = _job(c, "s1")
    assert listed["cwd"] == job["workdir"] and listed["cwd"].startswith(str(home / ".cache"))
    assert job["synced_from"] == str(project)
    for name in ODD:
        assert (Path(listed["cwd"]) / name).read_text() == name


def test_each_job_keeps_its_own_copy_and_a_change_reaches_the_next_run(c, tmp_path):
    project = _project(tmp_path / "proj")
    slow = "import time; time.sleep(3); print(open('v.txt').read())"
    first = c.cli(
        "run",
        "--node",
        "node01",
        "--name",
        "old",
        "--sync",
        "--",
        "python3",
        "-c",
        slow,
        cwd=project,
    )
    assert first.returncode == 0, first.stderr
    # --sync-dir: the same project, typed from elsewhere
    (project / "v.txt").write_text("two")  # edited while the first job runs
    proc = c.cli(
        "run",
        "--node",
        "node01",
        "--name",
        "new",
        "--sync-dir",
        str(project),
        "--",
        "python3",
        "list.py",
    )
    assert proc.returncode == 0, proc.stderr
    assert _listed(c, "new")["v"] == "two"
    _wait(c, "old")
    assert c.ok("logs", "old", "-n", "0").strip().splitlines()[-1] == "one"
    # each copy's files are its own: no hard link between copies (a job may write in place)
    a, b = (Path(_job(c, n)["workdir"]) for n in ("old", "new"))
    assert a != b
    for rel in ("list.py", "v.txt"):
        assert (a / rel).stat().st_ino != (b / rel).stat().st_ino
        assert (a / rel).stat().st_nlink == (b / rel).stat().st_nlink == 1


GPUCLAIM = [sys.executable, "-m", "gpuclaim"]
LIST_SYNCED = ["--sync", "--", "python3", "list.py"]


def _spare(c, node="node01"):
    sync = c.testbed.node_dir(node) / "home" / ".cache" / "gpuclaim" / "sync"
    return next(iter(sync.glob("*/.spare")), None)


def _wait_for_spare(c, node="node01", timeout=20.0):
    """The node links the spare for the next copy in the background, after a copy."""
    deadline = time.monotonic() + timeout
    while _spare(c, node) is None:
        assert time.monotonic() < deadline, "no spare tree was built"
        time.sleep(0.1)
    return _spare(c, node)


def _sync_run(c, project, name, *argv):
    proc = c.cli("run", "--node", "node01", "--name", name, "--sync", "--", *argv, cwd=project)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("git", [True, False], ids=["git", "no-git"])
def test_the_next_copy_starts_from_the_spare_and_holds_exactly_the_project_now(c, tmp_path, git):
    """The spare (a copy of the last copy, built after it) is updated in place: what the
    project no longer has is gone from it, what the last job wrote never was in it, and the
    last job's own copy is left exactly as it was."""
    project = _project(tmp_path / "proj", git=git)
    writes = "open('result.txt', 'w').write('first job'); open('v.txt', 'a').write('!')"
    _sync_run(c, project, "first", "python3", "-c", writes)
    assert _wait(c, "first")["state"] == "succeeded"
    assert _job(c, "first")["synced"]["incremental"] == {"node01": "none"}
    _wait_for_spare(c)
    (project / "with space.py").unlink()  # deleted
    (project / "v.txt").write_text("two")  # changed
    (project / "new dir").mkdir()
    (project / "new dir" / "new.py").write_text("new")  # added
    with open(project / ".gitignore", "a") as fh:
        fh.write("sub dir/deep/\n")  # was copied, now ignored: its dir goes too
    _sync_run(c, project, "second", "python3", "list.py")
    listed = _listed(c, "second")
    assert _job(c, "second")["synced"]["incremental"] == {"node01": "spare"}
    expected = sorted({*EXPECTED, "new dir/new.py"} - {"with space.py", "sub dir/deep/x.cfg"})
    assert listed["files"] == expected and listed["v"] == "two"
    second = Path(listed["cwd"])
    assert not (second / "sub dir" / "deep").exists()
    home = c.testbed.node_dir("node01") / "home"
    first = Path(_job(c, "first")["workdir"].replace("~", str(home), 1))
    assert (first / "v.txt").read_text() == "one!"  # what the first job wrote, untouched
    assert (first / "result.txt").read_text() == "first job"
    assert (first / "with space.py").is_file() and (first / "sub dir/deep/x.cfg").is_file()
    assert (first / "list.py").stat().st_ino != (second / "list.py").stat().st_ino
    # and the spare after the second copy holds the second copy's files
    spare = _wait_for_spare(c)
    listed_spare = sorted(
        str(p.relative_to(spare / "tree")) for p in (spare / "tree").rglob("*") if p.is_file()
    )
    assert listed_spare == expected


def _runs_at_once(c, project, names, argv):
    """``run --node node01 --name NAME *argv`` for each of ``names`` at once; what each
    one's copy started from."""
    procs = [
        subprocess.Popen(
            [*GPUCLAIM, "run", "--node", "node01", "-n", "1", "--name", n, *argv],
            cwd=project,
            env=c.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in names
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    return {_job(c, n)["synced"]["incremental"]["node01"] for n in names}


def test_two_runs_of_one_project_at_once_each_get_a_whole_copy(c, tmp_path):
    """Both want the one spare: one takes it, the other starts from a copy of the newest
    copy, made on the node."""
    project = _project(tmp_path / "proj")
    _sync_run(c, project, "warm", "true")
    for rounds in range(3):
        _wait_for_spare(c)
        (project / "v.txt").write_text(f"round {rounds}")
        names = [f"r{rounds}a", f"r{rounds}b"]
        # one takes the spare; the other starts from a copy of the newest copy, or takes the
        # spare the first one's copy left if it comes that much later
        starts = _runs_at_once(c, project, names, LIST_SYNCED)
        assert starts <= {"spare", "previous"}, starts
        for n in names:
            listed = _listed(c, n)
            assert listed["files"] == EXPECTED and listed["v"] == f"round {rounds}"


def test_of_two_syncs_taking_the_spare_at_once_exactly_one_gets_it(tmp_path, monkeypatch):
    """The node side alone, six processes at the same instant: one rename wins."""
    monkeypatch.setenv("HOME", str(tmp_path))
    from gpuclaim.node import copies

    key = "proj-0123456789"
    copy = tmp_path / ".cache" / "gpuclaim" / "sync" / key / "j-first"
    (copy / "pkg").mkdir(parents=True)
    (copy / "pkg" / "a.py").write_text("a")
    copies.sync_target(key, "j-first", ["pkg/a.py"], reuse=True)  # writes its file list
    assert copies.build_spare(key, "j-first") is not None
    code = (
        "import sys, json; from gpuclaim.node import copies\n"
        "t = copies.sync_target(sys.argv[1], sys.argv[2], ['pkg/a.py'], reuse=True)\n"
        "print(json.dumps(t))"
    )
    env = {**os.environ, "HOME": str(tmp_path)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, key, f"j-{i}"], env=env, stdout=subprocess.PIPE, text=True
        )
        for i in range(6)
    ]
    targets = [json.loads(p.communicate(timeout=30)[0]) for p in procs]
    assert sorted(t["spare"] for t in targets) == [False] * 5 + [True]
    taker = next(t for t in targets if t["spare"])
    assert (Path(taker["dest"]) / "pkg" / "a.py").read_text() == "a"
    assert all(t["previous"] for t in targets if not t["spare"])
    for t in targets:  # each its own file, the takers' from the spare, the others' copied
        copied = Path(t["dest"]) / "pkg" / "a.py"
        assert copied.read_text() == "a" and copied.stat().st_nlink == 1


# A job that writes synced files in place: appends to one, overwrites the first byte of another
EDIT_IN_PLACE = (
    "open('v.txt', 'a').write(' appended')\nwith open('list.py', 'r+') as fh:\n    fh.write('#')\n"
)
EDITED = {"v.txt": "one appended", "list.py": "#" + LIST[1:]}
ORIGINAL = {"v.txt": "one", "list.py": LIST}


def _copy_of(c, name, node="node01"):
    home = c.testbed.node_dir(node) / "home"
    return Path(str(_job(c, name)["workdir"]).replace("~", str(home), 1))


def _assert_isolated(edited, others, spare):
    """The editors' copies hold their own edit once; every other copy and the spare hold
    the project as it was (the spare may leave out a file its job touched: rsync sends it);
    no two trees share an inode."""
    for tree in edited:
        for rel, text in EDITED.items():
            assert (tree / rel).read_text() == text, (tree, rel)
    for tree in others:
        for rel, text in ORIGINAL.items():
            assert (tree / rel).read_text() == text, (tree, rel)
    for rel, text in ORIGINAL.items():
        if (spare / rel).exists():
            assert (spare / rel).read_text() == text, ("spare", rel)
    trees = [*edited, *others, spare]
    for rel in (*ORIGINAL, "with space.py", "sub dir/deep/x.cfg"):
        stats = [(t / rel).stat() for t in trees if (t / rel).exists()]
        assert all(st.st_nlink == 1 for st in stats), (rel, [st.st_nlink for st in stats])
        assert len({st.st_ino for st in stats}) == len(stats), rel


def test_a_job_editing_synced_files_in_place_changes_no_other_copy_nor_the_spare(c, tmp_path):
    """[hardening-3] One job after another (the second starts from the spare tree): the
    second appends to a synced file and overwrites another in place; the first job's copy,
    the spare and the next job's copy still hold the project's bytes."""
    project = _project(tmp_path / "proj")
    _sync_run(c, project, "first", "true")
    assert _wait(c, "first")["state"] == "succeeded"
    _wait_for_spare(c)
    _sync_run(c, project, "editor", "python3", "-c", EDIT_IN_PLACE)
    assert _job(c, "editor")["synced"]["incremental"] == {"node01": "spare"}
    assert _wait(c, "editor")["state"] == "succeeded"
    _wait_for_spare(c)
    _sync_run(c, project, "third", "python3", "list.py")
    assert _job(c, "third")["synced"]["incremental"] == {"node01": "spare"}
    listed = _listed(c, "third")
    assert listed["files"] == EXPECTED and listed["v"] == "one"
    spare = _wait_for_spare(c) / "tree"
    others = [_copy_of(c, "first"), _copy_of(c, "third")]
    _assert_isolated([_copy_of(c, "editor")], others, spare)


def test_concurrent_jobs_editing_synced_files_in_place_each_edit_their_own(c, tmp_path):
    """[hardening-3] Two runs at once (one takes the spare, the other starts from a copy of
    the previous copy), then one with the spare gone: each edits only its own files."""
    project = _project(tmp_path / "proj")
    _sync_run(c, project, "warm", "true")
    assert _wait(c, "warm")["state"] == "succeeded"
    _wait_for_spare(c)
    names = ["edit-a", "edit-b"]
    starts = _runs_at_once(c, project, names, ["--sync", "--", "python3", "-c", EDIT_IN_PLACE])
    assert starts <= {"spare", "previous"}, starts
    for n in names:
        assert _wait(c, n)["state"] == "succeeded", c.ok("logs", n, "-n", "0")
    spare = _wait_for_spare(c)
    while list(spare.parent.glob(".building-*")):  # the other editor's builder, if at work
        time.sleep(0.1)
    shutil.rmtree(spare)  # the next run finds none: it copies the newest copy
    _sync_run(c, project, "edit-c", "python3", "-c", EDIT_IN_PLACE)
    assert _job(c, "edit-c")["synced"]["incremental"] == {"node01": "previous"}
    assert _wait(c, "edit-c")["state"] == "succeeded"
    edited = [_copy_of(c, n) for n in (*names, "edit-c")]
    _assert_isolated(edited, [_copy_of(c, "warm")], _wait_for_spare(c) / "tree")


def test_the_spare_is_a_copy_without_what_the_job_wrote_after_its_copy_was_whole(
    tmp_path, monkeypatch
):
    """[hardening-3] The node side alone: the spare's files are new inodes with the copy's
    bytes, modes, times and symlinks; a file written after the copy was whole is left out
    (rsync sends it to the next copy), not copied with the job's bytes."""
    monkeypatch.setenv("HOME", str(tmp_path))
    from gpuclaim.node import copies

    key, names = "proj-0123456789", ["pkg/a.py", "ro.txt", "log.csv", "link"]
    copy = tmp_path / ".cache" / "gpuclaim" / "sync" / key / "j-first"
    (copy / "pkg").mkdir(parents=True)
    (copy / "pkg" / "a.py").write_text("a")
    (copy / "ro.txt").write_text("read only")
    (copy / "ro.txt").chmod(0o444)
    (copy / "log.csv").write_text("step,loss\n")
    (copy / "link").symlink_to("pkg/a.py")
    os.utime(copy / "pkg" / "a.py", (1_000_000_000, 1_000_000_000))
    copies.sync_target(key, "j-first", names, reuse=True)  # its list: the copy is whole
    time.sleep(0.05)  # deliberately: the filesystem's coarse clock moves past its stamp
    with open(copy / "log.csv", "a") as fh:  # the job appends
        fh.write("1,0.5\n")
    spare = Path(copies.build_spare(key, "j-first") or "") / "tree"
    assert sorted(str(p.relative_to(spare)) for p in spare.rglob("*")) == sorted(
        ["pkg", "pkg/a.py", "ro.txt", "link"]
    )
    for rel in ("pkg/a.py", "ro.txt"):
        mine, theirs = (copy / rel).stat(), (spare / rel).stat()
        assert (spare / rel).read_bytes() == (copy / rel).read_bytes()
        assert theirs.st_ino != mine.st_ino and theirs.st_nlink == mine.st_nlink == 1
        assert (theirs.st_mode, theirs.st_mtime_ns) == (mine.st_mode, mine.st_mtime_ns)
    assert os.readlink(spare / "link") == "pkg/a.py"
    assert (copy / "log.csv").read_text() == "step,loss\n1,0.5\n"  # the job's, untouched


BUILDING_S = 0.5  # how long the live builder below takes


def test_a_sync_waits_for_a_live_builder_and_not_for_a_dead_one(tmp_path, monkeypatch):
    """[hardening-3] The node side alone: with no spare but a builder at work (its lock
    held), the sync waits and takes its spare; a builder's leftovers (no lock) are not
    waited for: the sync copies the newest copy itself."""
    monkeypatch.setenv("HOME", str(tmp_path))
    from gpuclaim.node import copies

    key = "proj-0123456789"
    base = tmp_path / ".cache" / "gpuclaim" / "sync" / key
    (base / "j-first").mkdir(parents=True)
    (base / "j-first" / "a.py").write_text("a")
    dead = base / ".building-j-dead"
    dead.mkdir()
    (dead / "lock").touch()
    started = time.monotonic()
    target = copies.sync_target(key, "j-second", ["a.py"], reuse=True)
    assert time.monotonic() - started < 1.0 and not target["spare"]
    assert target["previous"] == str(base / "j-first")
    live = base / ".building-j-live"
    (live / "tree").mkdir(parents=True)
    (live / "tree" / "a.py").write_text("a")
    (live / "list").write_text("a.py")
    with open(live / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)

        def finish() -> None:
            time.sleep(BUILDING_S)  # deliberately: the builder is at work this long
            live.rename(base / ".spare")
            fcntl.flock(lock, fcntl.LOCK_UN)

        builder = threading.Thread(target=finish)
        builder.start()
        started = time.monotonic()
        target = copies.sync_target(key, "j-third", ["a.py"], reuse=True)
        builder.join()
    assert target["spare"] and time.monotonic() - started >= BUILDING_S
    assert (base / "j-third" / "a.py").read_text() == "a"


def test_a_file_written_while_it_is_copied_is_left_out(tmp_path):
    """[hardening-3] A job appending to a file while the node copies it: the copy would be
    torn, so the file is left out (rsync sends it whole); the others are copied."""
    from gpuclaim.node.copies import copy_files

    source, tree = tmp_path / "copy", tmp_path / "tree"
    source.mkdir()
    (source / "quiet.txt").write_text("quiet")
    size = 64 << 20
    with open(source / "busy.log", "wb") as fh:
        fh.write(os.urandom(size))
    stop = threading.Event()

    def append() -> None:
        with open(source / "busy.log", "ab", buffering=0) as fh:
            while not stop.is_set():
                fh.write(b"x")

    writer = threading.Thread(target=append)
    writer.start()
    try:
        deadline = time.monotonic() + 10
        while (source / "busy.log").stat().st_size == size:  # until the writer is at work
            assert time.monotonic() < deadline, "the writer never appended"
            time.sleep(0.01)
        copied = copy_files(source, tree, ["busy.log", "quiet.txt"])
    finally:
        stop.set()
        writer.join()
    assert copied == ["quiet.txt"]
    assert sorted(os.listdir(tree)) == ["quiet.txt"]


def test_a_gang_job_gets_the_copy_on_every_node(c, tmp_path):
    project = _project(tmp_path / "proj")
    proc = c.cli(
        "run",
        "--nodes",
        "2",
        "-n",
        "1",
        "--name",
        "gang",
        "--sync",
        "--",
        "python3",
        "list.py",
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    job = _wait(c, "gang")
    assert job["state"] == "succeeded"
    for node in job["nodes"]:
        copy = Path(str(job["workdir"]).replace("~", str(c.testbed.node_dir(node) / "home"), 1))
        assert (copy / "list.py").is_file() and (copy / "ünï ✓.txt").is_file(), node


WRITE = (
    "import os; os.makedirs('out/run 1', exist_ok=True)\n"
    "open('out/run 1/metrics.json', 'w').write('{\"loss\": 0.5}')\n"
    "open('ünï result.txt', 'w').write('done')\n"
)


@pytest.mark.parametrize("client", ["auto", "fabric"])
def test_pull_brings_back_what_the_job_wrote(testbed, make_remote, tmp_path, client):
    c = make_remote(testbed, ssh_client=client)
    project = _project(tmp_path / "proj")
    c.ok(
        "run",
        "--node",
        "node02",
        "--name",
        "w",
        "--sync-dir",
        str(project),
        "--",
        "python3",
        "-c",
        WRITE,
    )
    assert _wait(c, "w")["state"] == "succeeded"
    back = tmp_path / "back"
    back.mkdir()
    proc = c.cli("pull", "w", "out", "ünï result.txt", cwd=back)
    assert proc.returncode == 0, proc.stderr
    assert (back / "out" / "run 1" / "metrics.json").read_text() == '{"loss": 0.5}'
    assert (back / "ünï result.txt").read_text() == "done"
    again = tmp_path / "again"
    again.mkdir()
    quiet = c.cli("pull", "-q", "w", "out/run 1/metrics.json", cwd=again)
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")
    assert (again / "out" / "run 1" / "metrics.json").is_file()
    # a path that is not there, or outside the job's directory: one line each
    missing = c.cli("pull", "w", "nope.txt", cwd=back)
    assert missing.returncode == 1 and len(missing.stderr.splitlines()) == 1, missing.stderr
    assert "not in the job's directory" in missing.stderr and "nope.txt" in missing.stderr
    outside = c.cli("pull", "w", "../../etc", cwd=back)
    assert outside.returncode == 2, outside.stderr
    assert outside.stderr.splitlines() == [
        "gpuclaim: error: pull takes paths inside the job's directory, not '../../etc'"
    ]


def test_sync_over_fabric_is_a_tar_stream(testbed, make_remote, tmp_path):
    c = make_remote(testbed, ssh_client="fabric")
    project = _project(tmp_path / "proj")
    proc = c.cli(
        "run", "--node", "node03", "--name", "ft", "--sync", "--", "python3", "list.py", cwd=project
    )
    assert proc.returncode == 0, proc.stderr
    assert _listed(c, "ft")["files"] == EXPECTED


def test_a_huge_or_missing_sync_is_one_line_and_nothing_starts(c, tmp_path):
    project = _project(tmp_path / "proj", git=False)
    with open(project / "weights.bin", "wb") as fh:  # sparse: 1.2 GiB that takes no disk
        fh.truncate(1288490189)
    proc = c.cli("run", "--name", "big", "--sync", "--", "python3", "list.py", cwd=project)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert (
        lines[0].startswith("gpuclaim: error: --sync would copy 1.2 GiB (")
        and "weights.bin" in lines[0]
    )
    assert c.json("jobs", "--all") == [] and all(r["state"] == "free" for r in c.status())
    nowhere = c.cli("run", "--sync-dir", str(tmp_path / "nope"), "--", "true")
    assert nowhere.returncode == 2
    assert nowhere.stderr.splitlines() == [
        f"gpuclaim: error: --sync {tmp_path / 'nope'}: does not exist"
    ]
    both = c.cli("run", "--sync", "-C", "/tmp", "--", "true", cwd=project)
    assert both.returncode == 2 and "--workdir cannot say otherwise" in both.stderr
    assert not (c.testbed.node_dir("node01") / "home" / ".cache" / "gpuclaim" / "sync").exists()
    assert os.listdir(project)  # the project untouched


def test_sync_max_in_the_config_and_in_the_project_file(testbed, make_remote, tmp_path):
    c = make_remote(testbed, extra_toml='\n[run]\nsync_max = "1K"\n')
    project = _project(tmp_path / "proj")
    (project / "blob.txt").write_text("x" * 3000)
    proc = c.cli("run", "--name", "small", "--sync", "--", "true", cwd=project)
    assert proc.returncode == 1, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert "more than 1.0 KiB; the biggest: blob.txt (2.9 KiB)" in first, first
    assert 'sync_max = "4GiB"' in proc.stderr  # the hint says how to allow more
    (project / "gpuclaim.toml").write_text('sync_max = "1MiB"\n')  # this project's own
    proc = c.cli("run", "--name", "allowed", "--sync", "--", "python3", "list.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "blob.txt" in _listed(c, "allowed")["files"]
    broken = make_remote(testbed, extra_toml='\n[run]\nsync_max = "big"\n')
    proc = broken.cli("run", "--sync", "--", "true", cwd=project)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "'sync_max': not a size: 'big'" in proc.stderr


def test_a_queued_sync_job_finds_its_copy_when_it_starts(c, tmp_path):
    """The laptop may be closed when a queued job starts: its copy is made at submit, on
    every node it could start on, and the node that starts it runs in it."""
    project = _project(tmp_path / "proj")
    blocker = c.json("claim", "-n", "4", "--node", "node01", "--time", "1h")
    proc = c.cli(
        "run",
        "--node",
        "node01",
        "-n",
        "4",
        "--queue",
        "--name",
        "qs",
        "--sync",
        "--",
        "python3",
        "list.py",
        cwd=project,
    )
    assert proc.returncode == 0, proc.stderr
    (project / "v.txt").write_text("edited after submit")  # not what the queued job runs
    c.ok("release", blocker["id"])
    listed = _listed(c, "qs")
    assert listed["files"] == EXPECTED and listed["v"] == "one"


KEEP_COPIES_S = 1  # [run] keep_copies of the test below


def test_gc_removes_copies_of_jobs_ended_long_ago_and_orphans(testbed, make_remote, tmp_path):
    c = make_remote(testbed, extra_toml=f'\n[run]\nkeep_copies = "{KEEP_COPIES_S}s"\n')
    project = _project(tmp_path / "proj")
    for name, argv in (("done", ["true"]), ("busy", ["sleep", "60"])):
        proc = c.cli("run", "--node", "node01", "--name", name, "--sync", "--", *argv, cwd=project)
        assert proc.returncode == 0, proc.stderr
    finished = _wait(c, "done")
    assert finished["state"] == "succeeded"
    home = c.testbed.node_dir("node01") / "home"
    done, busy = (
        Path(str(_job(c, n)["workdir"]).replace("~", str(home), 1)) for n in ("done", "busy")
    )
    orphan = done.parent / "j-0rphan0000"  # a copy whose run never made a job
    orphan.mkdir()
    os.utime(orphan, (time.time() - 2 * 86400,) * 2)
    _wait_until(parse_iso(finished["ended"]) + KEEP_COPIES_S + 0.1)  # done's copy: kept no more
    report = c.json("gc")
    assert report["sync_copies_removed"]["node01"] == 2, report
    assert not done.exists() and not orphan.exists()
    assert (busy / "list.py").is_file()  # its job still runs from it
    assert (busy.parent / ".spare").is_dir()  # the next copy's, kept while copies are
    c.ok("kill", "busy")
    _wait_until(parse_iso(_wait(c, "busy")["ended"]) + KEEP_COPIES_S + 0.1)
    assert c.json("gc")["sync_copies_removed"]["node01"] == 1
    assert not busy.parent.exists()  # the spare went with the project's last copy


def test_a_node_without_rsync_gets_a_tar_stream_over_the_ssh_binary(
    make_testbed, make_remote, tmp_path
):
    tb = make_testbed(1, without=("rsync",))
    c = make_remote(tb)
    project = _project(tmp_path / "proj")
    proc = c.cli("run", "--name", "nr", "--sync", "--", "python3", "list.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert _listed(c, "nr")["files"] == EXPECTED
    assert _job(c, "nr")["synced"]["how"] == {"node01": "tar"}
    # and back: pull without rsync on the node
    proc = c.cli("run", "--name", "nw", "--sync", "--", "python3", "-c", WRITE, cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert _wait(c, "nw")["state"] == "succeeded"
    back = tmp_path / "back"
    back.mkdir()
    assert c.cli("pull", "nw", "out", cwd=back).returncode == 0
    assert (back / "out" / "run 1" / "metrics.json").is_file()
