"""[sweeps]: job arrays, sweep files and dependencies, through the CLI on the sshd testbed
(2 nodes x 4 GPUs, real tmux), with nobody calling gpuclaim while the tasks run: the job
wrappers dispatch the queue as GPUs free up."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from test_slack import FakeSlack, _with_slack

from gpuclaim.core.arrays import parse_array_spec, parse_sweep
from gpuclaim.core.errors import UsageError
from gpuclaim.core.model import parse_iso
from gpuclaim.node.queue_keeper import POLL_S

# A task: note when it ran, where (its GPUs) and what it was given; then work for a while.
TASK = (
    "import json, os, sys, time; t0 = time.time(); time.sleep(float(sys.argv[2]));"
    " rec = {'index': os.environ.get('GPUCLAIM_ARRAY_INDEX'), 'job': os.environ.get("
    "'GPUCLAIM_ARRAY_JOB'), 'count': os.environ.get('GPUCLAIM_ARRAY_COUNT'), 'gpus':"
    " os.environ.get('CUDA_VISIBLE_DEVICES'), 'start': t0, 'end': time.time(), 'argv':"
    " sys.argv[3:]};"
    " open(os.path.join(sys.argv[1], os.environ['GPUCLAIM_ARRAY_INDEX'] + '.' +"
    " str(os.getpid())), 'w').write(json.dumps(rec)); print('task', rec['index'])"
)


@pytest.fixture
def two_nodes(testbed, make_remote):
    """The issue's cluster: 2 nodes x 4 GPUs."""
    return make_remote(testbed, nodes=["node01", "node02"], kill_grace="2s", heartbeat="1s")


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.iterdir())]


def _task_rows(c, user="alice"):
    return [r for r in c.json("jobs", "--all", user=user) if r.get("array")]


def _stored_jobs(c) -> list[dict]:
    """The job records as the storage holds them: reading them calls no gpuclaim (which
    would dispatch the queue itself)."""
    return [json.loads(p.read_text()) for p in (c.storage / "jobs").glob("*.json")]


def _wait_stored(c, done, timeout):
    deadline = time.monotonic() + timeout
    while True:
        jobs = _stored_jobs(c)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, sorted((j["name"], j["state"]) for j in jobs)
        time.sleep(0.5)


def _most_at_once(records: list[dict]) -> int:
    points = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    most = running = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


def test_a_96_task_array_runs_every_index_once_and_never_two_on_one_gpu(two_nodes, tmp_path):
    c = two_nodes
    out = tmp_path / "out"
    out.mkdir()
    t0, wall0 = time.monotonic(), time.time()
    submitted = c.json(
        "run", "--array", "0-95", "--name", "sweep", "--", "python3", "-c", TASK, str(out), "2"
    )
    returned_s = time.monotonic() - t0
    assert submitted["count"] == 96 and len(submitted["tasks"]) == 96
    assert sum(submitted["states"].values()) == 96
    # Nobody calls gpuclaim from here on: the wrappers start the next tasks.
    jobs = _wait_stored(c, lambda js: sum(j["state"] == "succeeded" for j in js) == 96, timeout=120)
    records = _records(out)
    makespan = max(r["end"] for r in records) - wall0
    print(f"run returned in {returned_s:.1f} s; makespan {makespan:.1f} s (ideal 24 s)")
    assert returned_s < 20, returned_s
    assert sorted(int(r["index"]) for r in records) == list(range(96))  # each index once
    assert {r["count"] for r in records} == {"96"}
    assert {r["job"] for r in records} == {submitted["id"]}
    assert len(jobs) == 96
    rows = _task_rows(c)  # as gpuclaim shows them (the stored records are its raw form)
    by_index = {int(j["array"]["index"]): j for j in rows}
    spans: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in records:
        job = by_index[int(r["index"])]
        assert len(job["gpus"]) == 1 and r["gpus"] == str(job["gpus"][0])
        spans.setdefault((job["node"], job["gpus"][0]), []).append((r["start"], r["end"]))
    for gpu, runs in spans.items():
        runs.sort()
        for (_, end), (start, _) in zip(runs, runs[1:]):
            assert start >= end, f"two tasks at once on {gpu}"
    assert len(spans) == 8  # all 8 GPUs were used
    assert makespan <= 2.5 * 24, makespan
    assert len(rows) == 96 and {r["state"] for r in rows} == {"succeeded"}
    assert {r["name"] for r in rows} == {f"sweep[{i}]" for i in range(96)}
    table = c.ok("jobs", "--all")
    assert "sweep[0-95]" in table and "96 succeeded" in table
    assert len([line for line in table.splitlines() if "sweep" in line]) == 1  # one line
    assert len(c.ok("jobs", "--all", "--tasks").strip().splitlines()) == 97
    assert c.ok("logs", "sweep[5]", "-n", "0").strip() == "task 5"  # a task's own log


def test_at_most_k_at_once_and_a_sweep_appends_each_lines_words_exactly(two_nodes, tmp_path):
    c = two_nodes
    out = tmp_path / "out"
    out.mkdir()
    c.ok("run", "--array", "0-7%2", "--name", "slow", "--", "python3", "-c", TASK, str(out), "1")
    _wait_stored(c, lambda js: sum(j["state"] == "succeeded" for j in js) == 8, timeout=60)
    records = _records(out)
    assert sorted(int(r["index"]) for r in records) == list(range(8))
    assert _most_at_once(records) == 2  # never more than 2, and 2 did run together
    sweep = tmp_path / "sweep.txt"
    lines = [
        "# learning rates, one task per line",
        "--lr 0.1 --name 'two words'",
        "",
        '--lr 0.01 --note "it\'s \\"quoted\\""  # not a comment to the shell',
        "   --unicode 'Grüße 🚀' $HOME *.py",
    ]
    sweep.write_text("\n".join(lines) + "\n")
    out2 = tmp_path / "out2"
    out2.mkdir()
    c.ok("run", "--sweep", str(sweep), "--name", "lr", "--", "python3", "-c", TASK, str(out2), "0")
    _wait_stored(c, lambda js: sum(j["name"].startswith("lr[") for j in js) == 3, timeout=5)
    _wait_stored(
        c,
        lambda js: sum(j["state"] == "succeeded" and j["name"].startswith("lr[") for j in js) == 3,
        timeout=60,
    )
    argv = {int(r["index"]): r["argv"] for r in _records(out2)}
    assert argv == {
        0: ["--lr", "0.1", "--name", "two words"],
        1: [
            "--lr",
            "0.01",
            "--note",
            'it\'s "quoted"',
            "#",
            "not",
            "a",
            "comment",
            "to",
            "the",
            "shell",
        ],
        2: ["--unicode", "Grüße 🚀", "$HOME", "*.py"],
    }


def test_after_waits_for_success_and_a_failed_dependency_cancels_its_dependants(
    two_nodes, tmp_path
):
    c = two_nodes
    go = tmp_path / "go"
    wait_go = f"while [ ! -e {go} ]; do sleep 0.2; done"
    c.ok("run", "--name", "prep", "--", "sh", "-c", wait_go)
    queued = c.json("run", "--name", "train", "--after", "prep", "--", "sh", "-c", "echo trained")
    assert queued["state"] == "queued"
    assert queued["after"] == [
        {"id": _job_id(c, "prep"), "name": "prep", "array": False, "any": False}
    ]
    c.ok("run", "--name", "bad", "--", "sh", "-c", f"{wait_go}; exit 3")
    c.ok("run", "--name", "never", "--after", "bad", "--", "sh", "-c", "echo must-not-run")
    c.ok("run", "--name", "anyway", "--after-any", "bad", "--", "sh", "-c", "echo cleanup")
    c.ok("run", "--array", "0-3", "--name", "evals", "--after", "never", "--", "true")
    # deliberately let time pass: while prep runs, train waits though GPUs are free, past
    # a queue keeper's looks (one every POLL_S)
    time.sleep(POLL_S + 1)
    states = {j["name"]: j["state"] for j in _stored_jobs(c)}
    assert states["train"] == states["never"] == states["anyway"] == "queued"
    go.touch()  # from here nobody calls gpuclaim: the wrappers of prep and bad dispatch
    jobs = _wait_stored(
        c,
        lambda js: (
            {j["name"]: j["state"] for j in js}.get("train") == "succeeded"
            and {j["name"]: j["state"] for j in js}.get("anyway") == "succeeded"
            and all(j["state"] == "cancelled" for j in js if j["name"].startswith("evals["))
        ),
        timeout=60,
    )
    named = {j["name"]: j for j in jobs}
    assert parse_iso(named["train"]["started"]) >= parse_iso(named["prep"]["ended"])
    never = named["never"]
    assert never["state"] == "cancelled" and never["started"] is None and not never["ranks"]
    assert "bad failed" in never["reason"]
    assert never["log"] is None  # it never had a session to write one
    assert "trained" in c.ok("logs", "train", "-n", "0")
    evals = [j for j in jobs if j["name"].startswith("evals[")]
    assert len(evals) == 4 and all("never cancelled" in j["reason"] for j in evals)
    assert not list((c.storage / "queue").iterdir())  # nothing left waiting


def _job_id(c, name):
    return next(j["id"] for j in c.json("jobs", "--all") if j["name"] == name)


def test_after_a_whole_array(two_nodes):
    c = two_nodes
    c.ok("run", "--array", "0-5", "--name", "pre", "--", "sleep", "1")
    after = c.json("run", "--name", "merge", "--after", "pre", "--", "true")
    assert after["after"][0]["array"] is True
    jobs = _wait_stored(
        c, lambda js: any(j["name"] == "merge" and j["state"] == "succeeded" for j in js), 60
    )
    merge = next(j for j in jobs if j["name"] == "merge")
    last = max(parse_iso(j["ended"]) for j in jobs if j["name"].startswith("pre["))
    assert parse_iso(merge["started"]) >= last


def test_kill_an_array_stops_it_and_the_rest_never_starts(two_nodes):
    c = two_nodes
    c.ok("run", "--array", "0-19", "--name", "big", "--", "sleep", "300")
    rows = _task_rows(c)
    assert sum(r["state"] in ("starting", "running") for r in rows) == 8
    c.ok("kill", "big[3]")  # one task alone, by its name: a queued task gets its GPU
    _wait_stored(
        c, lambda js: sum(j["state"] in ("starting", "running") for j in js) == 8, timeout=20
    )
    said = c.ok("kill", "big")
    assert "20 tasks" in said
    _wait_quiet(c, "gc-alice-big")
    # a stopped task's wrapper must not have started a queued one
    rows = _task_rows(c)
    assert {r["state"] for r in rows} == {"killed"}, {r["name"]: r["state"] for r in rows}
    assert sum(1 for r in rows if r["started"]) == 9  # 8, and the one after big[3]
    assert not list((c.storage / "queue").iterdir())


def _wait_quiet(c, session: str, timeout: float = 20.0) -> None:
    """Until nothing is left that could start a task: on no node a tmux session whose name
    starts with ``session`` (a task's wrapper, which dispatches the queue as it ends), and no
    queue keeper (it holds its lock in the store while it lives)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [
            name
            for node in ("node01", "node02")
            for name in c.testbed.ssh(node, "tmux ls -F '#S' 2>/dev/null || true").stdout.split()
            if name.startswith(session)
        ]
        left += [p.name for p in (c.storage / "locks").glob("queue-keeper-*")]
        if not left:
            return
        assert time.monotonic() < deadline, f"still there {timeout}s after the kill: {left}"
        time.sleep(0.3)


@pytest.mark.parametrize(
    "spec",
    ["", "5-2", "0-10:0", "a", "%2", "0-3%0", "1-", "0-3%x", "0-20000", "1,,2", "-1"],
)
def test_malformed_array_specs_are_one_line(spec):
    with pytest.raises(UsageError) as caught:
        parse_array_spec(spec)
    assert "\n" not in str(caught.value)


def test_array_specs_as_slurm_writes_them():
    assert parse_array_spec("0-95").indices == tuple(range(96))
    assert parse_array_spec("1,3,5-7").indices == (1, 3, 5, 6, 7)
    assert parse_array_spec("0-10:2").indices == (0, 2, 4, 6, 8, 10)
    got = parse_array_spec("0-15%4")
    assert (got.max_running, got.text()) == (4, "0-15%4")
    assert parse_sweep("# c\n\na 'b c'\n", "f") == [("a", "b c")]


def test_bad_input_is_one_line_and_queues_nothing(two_nodes, tmp_path):
    c = two_nodes
    empty = tmp_path / "empty.txt"
    empty.write_text("# only a comment\n\n")
    unbalanced = tmp_path / "unbalanced.txt"
    unbalanced.write_text("--ok 1\n--bad 'open\n")
    cases = [
        (["--array", "5-2"], "ends before it starts"),
        (["--array", "0-3%0"], "%K"),
        (["--sweep", str(empty)], "has no tasks"),
        (["--sweep", str(unbalanced)], "line 2: No closing quotation"),
        (["--sweep", str(tmp_path / "missing.txt")], "no such file"),
        (["--array", "0-3", "--sweep", str(empty)], "one task list"),
        (["--array", "0-3", "--follow"], "--follow"),
        (["--max-running", "2"], "--array or --sweep"),
        (["--after", "nobody"], "no job or array named 'nobody'"),
        (["--name", "loop", "--after", "loop"], "cannot wait for itself"),
        (["--array", "0-1", "--name", "loop", "--after", "loop"], "cannot wait for itself"),
    ]
    for args, expected in cases:
        proc = c.cli("run", *args, "--", "true")
        assert proc.returncode == 2, (args, proc.returncode, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, proc.stderr)
    c.cli("run", "--name", "fails", "--", "sh", "-c", "exit 4")
    proc = c.cli("run", "--after", "fails", "--", "true")
    assert proc.returncode == 2 and "already ended (failed)" in proc.stderr, proc.stderr
    assert [j["name"] for j in c.json("jobs", "--all")] == ["fails"]
    assert not list((c.storage / "queue").iterdir())
    assert not list((c.storage / "jobs").glob("*.array"))


def test_an_array_posts_once_when_it_starts_and_once_when_it_ends(make_cluster):
    slack = FakeSlack()
    try:
        c = make_cluster({"node01": 2}, fast=True)
        _with_slack(c, slack.url)
        c.ok(
            "run",
            "--array",
            "0-5",
            "--name",
            "grid",
            "--",
            "sh",
            "-c",
            'sleep 0.5; [ "$GPUCLAIM_ARRAY_INDEX" != 2 ] && [ "$GPUCLAIM_ARRAY_INDEX" != 4 ]',
        )
        deadline = time.monotonic() + 60
        while not any("ended" in m.get("text", "") for m in slack.received):
            assert time.monotonic() < deadline, slack.received
            time.sleep(0.5)
            c.cli("status")  # anyone's call delivers what the wrappers could not yet
        slack.let_late_posts_land()
        c.cli("status")
        texts = [m["text"] for m in slack.received]
        arrays = [t for t in texts if "grid" in t]
        assert len(arrays) == 2, texts
        assert "array grid started: 6 tasks" in arrays[0]
        assert "4 succeeded" in arrays[1] and "2 failed" in arrays[1]
        assert "failed: 2, 4" in json.dumps(slack.received[-1]["blocks"])
        assert not any("grid[" in t for t in texts)  # never one per task
    finally:
        slack.close()


def test_export_sbatch_of_an_array_a_sweep_and_a_dependency(make_cluster, tmp_path):
    c = make_cluster({"node01": 2}, fast=True)
    # grid's tasks last until the test is done: ended (failed) before merge was asked for,
    # merge's --after grid would rightly be refused (a loaded CI machine got there)
    gate = tmp_path / "done"
    (c.home / "train.py").write_text(
        f"import pathlib, time\nfor _ in range(600):\n    if pathlib.Path({str(gate)!r}).exists():"
        "\n        break\n    time.sleep(0.1)\n"
    )
    c.ok("run", "--array", "0-3%2", "--name", "grid", "--", "python3", "train.py", "--x")
    sweep = tmp_path / "lrs.txt"
    sweep.write_text("--lr 0.1 --tag 'a b'\n--lr 0.01 --tag $HOME\n")
    c.ok("run", "--sweep", str(sweep), "--name", "lr", "--", "python3", "train.py")
    c.ok("run", "--name", "merge", "--after", "grid", "--after-any", "lr", "--", "true")
    script = c.ok("export", "sbatch", "grid")
    assert "#SBATCH --job-name=grid" in script and "#SBATCH --array=0-3%2" in script
    assert "#SBATCH --output=logs/%A_%a.out" in script
    assert 'export GPUCLAIM_ARRAY_INDEX="$SLURM_ARRAY_TASK_ID"' in script
    assert script.rstrip().endswith("python3 train.py --x")
    lr = c.ok("export", "sbatch", "lr")
    # what every task shares stays on the command line; each task's own words go per index
    assert "  0) words=(0.1 --tag 'a b') ;;" in lr
    assert "  1) words=(0.01 --tag '$HOME') ;;" in lr
    assert lr.rstrip().endswith('python3 train.py --lr "${words[@]}"')
    out = tmp_path / "scripts"
    c.ok("export", "sbatch", "--history", "1", "--out", str(out))
    assert sorted(p.name for p in out.iterdir()) == [
        "grid.sbatch",
        "lr.sbatch",
        "merge.sbatch",
        "submit-all.sh",
    ]
    chain = (out / "submit-all.sh").read_text().splitlines()
    submits = [line for line in chain if "$(sbatch" in line]
    assert submits == [
        "job0=$(sbatch --parsable grid.sbatch)",
        "job1=$(sbatch --parsable lr.sbatch)",
        "job2=$(sbatch --parsable --dependency=afterok:$job0,afterany:$job1 merge.sbatch)",
    ]
    # "id;cluster" (a federation) becomes the id, under a real bash
    keep_id = chain[chain.index(submits[0]) + 1]
    got = subprocess.run(
        ["bash", "-c", f'job0="123;lab"\n{keep_id}\necho "$job0"'], capture_output=True, text=True
    )
    assert got.stdout == "123\n"
    assert "--dependency=afterok:<the SLURM job id of grid>" in (out / "merge.sbatch").read_text()
    # the case statement hands each task its words exactly, under a real bash
    body = lr.rstrip().rsplit("\n", 1)[0] + '\nprintf "%s\\n" "${words[@]}"\n'
    got = subprocess.run(
        ["bash", "-c", body],
        env={"SLURM_ARRAY_TASK_ID": "1", "PATH": "/usr/bin:/bin", "HOME": "/nowhere"},
        capture_output=True,
        text=True,
    )
    assert got.stdout.splitlines() == ["0.01", "--tag", "$HOME"], got.stderr
    gate.touch()  # grid's tasks may end now
