"""The board driven with Textual's Pilot against the real store, real local nodes with
simulated GPUs, and the real sshd testbed; other users act through the real CLI."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Optional

import pytest

from gpuclaim.board.app import BoardApp, make_app
from gpuclaim.board.dialogs import ClaimDialog, ConfirmDialog
from gpuclaim.board.services import BoardOptions, BoardServices
from gpuclaim.cli.common import AppState
from gpuclaim.core.model import parse_iso
from gpuclaim.entry.board_command import board_services

SIZE = (120, 30)


def services(c: Any, monkeypatch: Any, user: str = "alice", **options: Any) -> BoardServices:
    """The board's services exactly as ``gpuclaim board`` builds them, for ``user``."""
    monkeypatch.setenv("GPUCLAIM_HOME", str(c.home))
    monkeypatch.setenv("GPUCLAIM_USER", user)
    monkeypatch.delenv("GPUCLAIM_CONFIG", raising=False)
    monkeypatch.delenv("GPUCLAIM_SSH_CONFIG", raising=False)
    options.setdefault("refresh_s", 0.3)
    return board_services(AppState(config_path=c.config_path), BoardOptions(**options))


async def until(pilot: Any, check: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.05)


def board_rows(app: BoardApp) -> dict[tuple[str, Optional[int]], str]:
    """What the table shows: (node, GPU index) -> the row's text."""
    table = app.table
    shown = {}
    for key in table.row_keys:
        row = app.rows_for(key)[0]
        shown[(row.node, row.index)] = " ".join(c.plain for c in table.get_row(key))
    return shown


def row_text(app: BoardApp, node: str, index: Optional[int]) -> str:
    return board_rows(app).get((node, index), "")


async def select(pilot: Any, app: BoardApp, node: str, index: Optional[int]) -> None:
    """Move the cursor to a GPU with the arrow keys, as a user would."""
    table = app.table
    for _ in range(5):  # a refresh landing between the key presses may reorder: try again
        target = next(
            i
            for i, k in enumerate(table.row_keys)
            if (app.rows_for(k)[0].node, app.rows_for(k)[0].index) == (node, index)
        )
        step = "down" if target > table.cursor_row else "up"
        for _ in range(abs(target - table.cursor_row)):
            await pilot.press(step)
        await pilot.pause()
        if table.cursor_row == target:
            return
    assert table.cursor_row == target


async def cli(c: Any, *args: str, user: str = "alice") -> Any:
    """Another user at another terminal: the real CLI in a new process."""
    proc = await asyncio.to_thread(c.cli, *args, user=user)
    assert proc.returncode in (0, 4), f"gpuclaim {' '.join(args)}: {proc.stderr}"
    return json.loads(proc.stdout) if "--json" in args else proc.stdout


async def fill_claim_dialog(pilot: Any, count: str, time_: str, note: str) -> None:
    """Type into the claim dialog field by field (count, node kept, time, note) and submit."""
    await until(pilot, lambda: isinstance(pilot.app.screen, ClaimDialog), "the claim dialog")
    await pilot.press("end", "ctrl+u", *count)
    await pilot.press("tab", "tab", "end", "ctrl+u", *time_)
    await pilot.press("tab", *note, "enter")


def notifications(app: BoardApp) -> str:
    return "\n".join(n.message for n in app._notifications)


# -- local nodes ------------------------------------------------------------------------------
# Named bd01.. : the simulated nvidia-smi counts any process on this machine that says it runs
# on a node of the same name as a job there, and other suites' clusters have a node01.


@pytest.mark.asyncio
async def test_a_claim_made_in_the_board_appears_in_status_json(make_cluster, monkeypatch):
    c = make_cluster({"bd01": 4, "bd02": 2}, fast=True)
    app = make_app(services(c, monkeypatch))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.loaded.is_set(), "the first refresh")
        assert "● free" in row_text(app, "bd01", 0)
        await pilot.press("c")
        await fill_claim_dialog(pilot, "2", "90m", "from the board")
        await until(pilot, lambda: "alice" in row_text(app, "bd01", 1), "the claim on the board")
        assert "export CUDA_VISIBLE_DEVICES=0,1" in notifications(app)
    rows = await cli(c, "status", "--json", user="bob")
    mine = [r for r in rows if r["claim"] and r["claim"]["user"] == "alice"]
    assert [(r["node"], r["index"]) for r in mine] == [("bd01", 0), ("bd01", 1)]
    assert mine[0]["claim"]["note"] == "from the board"
    claim = mine[0]["claim"]
    length = parse_iso(claim["expires"]) - parse_iso(claim["since"])
    assert length == pytest.approx(90 * 60, abs=1)


@pytest.mark.asyncio
async def test_a_bad_claim_form_says_why_and_nothing_is_claimed(make_cluster, monkeypatch):
    c = make_cluster({"bd01": 2}, fast=True)
    app = make_app(services(c, monkeypatch))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.loaded.is_set(), "the first refresh")
        await pilot.press("c")
        await fill_claim_dialog(pilot, "1", "forever", "")
        assert isinstance(app.screen, ClaimDialog)  # still open, with the reason
        assert "not a duration" in str(app.screen.query_one("#error").render())
        await pilot.press("escape")
        await pilot.press("c")
        await fill_claim_dialog(pilot, "3", "1h", "")  # more than bd01 has
        await until(pilot, lambda: "GPU" in notifications(app), "the refusal")
    assert all(r["claim"] is None for r in await cli(c, "status", "--json"))


@pytest.mark.asyncio
async def test_another_users_cli_claim_appears_at_the_next_refresh(make_cluster, monkeypatch):
    c = make_cluster({"bd01": 2, "bd02": 2}, fast=True)
    app = make_app(services(c, monkeypatch, refresh_s=0.5))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.loaded.is_set(), "the first refresh")
        await cli(c, "claim", "--gpu", "bd02:1", "--note", "bob's eval", user="bob")
        reads = app.reads
        await until(pilot, lambda: "bob" in row_text(app, "bd02", 1), "bob's claim", 10)
        # the read in flight may predate the claim; the one after it shows it
        assert app.reads <= reads + 2
        assert "bob's eval" in row_text(app, "bd02", 1)
        assert "■ claimed" in row_text(app, "bd02", 1)


@pytest.mark.asyncio
async def test_release_own_claim_and_not_someone_elses(make_cluster, monkeypatch):
    c = make_cluster({"bd01": 4}, fast=True)
    mine = (await cli(c, "claim", "--gpu", "bd01:1,2", "--json"))["id"]
    await cli(c, "claim", "--gpu", "bd01:3", user="bob")
    app = make_app(services(c, monkeypatch))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "bob" in row_text(app, "bd01", 3), "bob's claim")
        await select(pilot, app, "bd01", 3)
        await pilot.press("r")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmDialog)
        assert "held by bob" in notifications(app)
        await select(pilot, app, "bd01", 2)
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: "● free" in row_text(app, "bd01", 1), "the release")
        assert f"claim {mine}" in notifications(app)
    by = {r["index"]: r for r in await cli(c, "status", "--json")}
    assert by[1]["state"] == by[2]["state"] == "free"
    assert by[3]["claim"]["user"] == "bob"


@pytest.mark.asyncio
async def test_filters_and_compact_view(make_cluster, monkeypatch):
    c = make_cluster({"bd01": 2, "bd02": 2, "bd03": 2}, fast=True)
    await cli(c, "claim", "--gpu", "bd02:0")
    await cli(c, "claim", "--gpu", "bd03:1", user="bob")
    app = make_app(services(c, monkeypatch, nodes=("bd02", "bd03")))
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.loaded.is_set(), "the first refresh")
        assert {node for node, _ in board_rows(app)} == {"bd02", "bd03"}
        await pilot.press("m")  # only mine
        assert list(board_rows(app)) == [("bd02", 0)]
        await pilot.press("escape", "f")
        await pilot.press(*"bob", "enter")
        await pilot.pause()
        assert list(board_rows(app)) == [("bd03", 1)]
        await pilot.press("escape", "v")  # compact: a line per node, in words
        table = app.table
        assert table.row_keys == ["node:bd01", "node:bd02", "node:bd03"]
        line = " ".join(cell.plain for cell in table.get_row("node:bd03"))
        assert "0 ● free" in line and "1 bob" in line and "1/2" in line


def test_once_and_svg_come_from_the_same_board(make_cluster, tmp_path):
    c = make_cluster({"bd01": 2, "bd02": 1}, fast=True)
    c.ok("claim", "--gpu", "bd01:1", "--note", "sweep", user="bob")
    text = c.ok("board", "--once", "--size", "100x20")
    lines = text.splitlines()
    assert lines[0].startswith("test: 2/3 GPUs free · 1 claimed · queue 0")
    assert "NODE" in lines[1] and "STATE" in lines[1]
    assert "■ claimed" in lines[3] and "bob" in lines[3] and "sweep" in lines[3]
    assert "● free" in lines[2] and "● free" in lines[4]
    svg = tmp_path / "board.svg"
    c.ok("board", "--svg", str(svg), "--size", "100x16")
    picture = svg.read_text()
    assert picture.startswith("<svg") and "sweep" in picture
    assert c.cli("board", "--node", "nope", "--once").returncode == 1
    assert c.cli("board").returncode == 2  # not a terminal: says to use --once


# -- over SSH: the testbed ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_over_ssh_claims_refreshes_and_a_dead_node_is_a_row(
    testbed, make_remote, monkeypatch
):
    c = make_remote(testbed)
    app = make_app(services(c, monkeypatch, refresh_s=0.5))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.loaded.is_set(), "the first refresh", 30)
        assert len(board_rows(app)) == 12
        await pilot.press("c")
        await fill_claim_dialog(pilot, "1", "2h", "over ssh")
        await until(pilot, lambda: "alice" in row_text(app, "node01", 0), "the claim", 30)
        rows = await cli(c, "status", "--json", user="bob")
        assert [(r["node"], r["index"]) for r in rows if r["claim"]] == [("node01", 0)]

        await cli(c, "claim", "--gpu", "node03:2", user="bob")
        await until(pilot, lambda: "bob" in row_text(app, "node03", 2), "bob's claim", 15)

        testbed.stop_node("node02")
        # A refresh that races sshd's exit may first read "no SSH banner"; once sshd is
        # gone the row says why plainly.
        await until(
            pilot,
            lambda: (
                "✕ unreachable" in row_text(app, "node02", None)
                and "connection refused" in row_text(app, "node02", None)
            ),
            "node02 to show as unreachable: connection refused",
            30,
        )
        # the rest keeps refreshing while node02 is down
        await cli(c, "release", "--all", user="bob")
        await until(pilot, lambda: "● free" in row_text(app, "node03", 2), "bob's release", 15)
        assert "alice" in row_text(app, "node01", 0)
        await select(pilot, app, "node01", 0)
        await pilot.press("r", "y")
        await until(pilot, lambda: "● free" in row_text(app, "node01", 0), "the release", 15)
    assert not [r for r in await cli(c, "status", "--json") if r["claim"]]


@pytest.mark.asyncio
async def test_a_frozen_node_turns_unreachable_within_a_refresh_and_connect_timeout(
    testbed, make_remote, monkeypatch, runtime
):
    """A node that stops answering (sshd and all its processes stopped) under an open board,
    its warm agent reached through a live master: its row says so within one refresh plus
    connect_timeout (5 s), the others keep refreshing, and it is back once it thaws."""
    c = make_remote(testbed, ssh_client="openssh", connect_timeout="5s", deadline="20s")
    app = make_app(services(c, monkeypatch, refresh_s=0.5))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.loaded.is_set(), "the first refresh", 30)
        await until(pilot, lambda: len(board_rows(app)) == 12, "all rows", 15)
        testbed.freeze_node("node02")
        frozen_at = time.monotonic()
        try:
            await until(
                pilot,
                lambda: "✕ unreachable" in row_text(app, "node02", None),
                "node02 to show as unreachable",
                30,
            )
            took = time.monotonic() - frozen_at
            assert took <= 0.5 + 5 + 1.5, f"the board took {took:.1f}s to see node02 frozen"
            await cli(c, "claim", "--gpu", "node03:1", user="bob")
            await until(pilot, lambda: "bob" in row_text(app, "node03", 1), "bob's claim", 15)
        finally:
            testbed.thaw_node("node02")
        await until(pilot, lambda: "● free" in row_text(app, "node02", 0), "node02 back", 30)


@pytest.mark.asyncio
async def test_job_log_attach_and_kill_from_the_board(testbed, make_remote, monkeypatch):
    c = make_remote(testbed, kill_grace="2s", heartbeat="1s")
    script = "echo hello-from-job; i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done"
    job = await cli(
        c, "run", "--node", "node02", "--name", "train", "--json", "--", "sh", "-c", script
    )
    gpu = job["gpus"][0]
    app = make_app(services(c, monkeypatch, refresh_s=0.5))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: "train" in row_text(app, "node02", gpu), "the job", 30)
        await select(pilot, app, "node02", gpu)
        await pilot.press("l")
        panel = app.log_panel
        await until(pilot, lambda: "hello-from-job" in "\n".join(panel.lines), "the log", 15)
        seen = len(panel.lines)
        await until(pilot, lambda: len(panel.lines) > seen + 2, "the log to follow", 15)

        await pilot.press("a")  # a headless test terminal cannot be handed over: says how
        await until(
            pilot,
            lambda: "attach-session -t =gc-alice-train" in notifications(app),
            "the attach command",
        )

        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the confirmation")
        await pilot.press("y")
        await until(pilot, lambda: "train: killed" in notifications(app), "the kill", 40)
        await until(pilot, lambda: "● free" in row_text(app, "node02", gpu), "the GPU freed", 15)
    ended = [j for j in await cli(c, "jobs", "--all", "--json") if j["name"] == "train"]
    assert ended[0]["state"] == "killed"


# -- a hung node --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_hung_node_never_blocks_and_its_old_data_says_how_old(tmp_path):
    from test_board_snapshots import FixedProber, services_for, synthetic_cluster

    class HangingProber(FixedProber):
        """node02 answers once, then hangs (a wedged nvidia-smi) until released."""

        def __init__(self, inner: FixedProber) -> None:
            super().__init__(inner.config, inner.inventories)
            self.answered: set[str] = set()
            self.release = threading.Event()

        def probe(self, nodes, enough=None, max_age_s=0.0):
            if [n.name for n in nodes] == ["node02"] and "node02" in self.answered:
                self.release.wait(30)
            self.answered.update(n.name for n in nodes)
            return super().probe(nodes)

    cluster = synthetic_cluster(tmp_path, 3, 2)
    prober = HangingProber(cluster.prober)
    cluster.prober = prober
    now = [1_767_225_600.0]
    svc = replace(services_for(cluster), clock=lambda: now[0])
    svc = replace(svc, options=replace(svc.options, refresh_s=0.2))
    app = make_app(svc)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.loaded.is_set(), "the first refresh")
            await until(pilot, lambda: app._probing == {"node02"}, "node02 to hang")
            now[0] += 42  # the board's clock moves on; node02 is still not answering
            reads = app.reads
            await until(pilot, lambda: app.reads >= reads + 2, "refreshes to go on")
            assert "⏱ 42s" in row_text(app, "node02", 1)  # its data, marked with its age
            assert "⏱" not in row_text(app, "node01", 1)  # the others are fresh
            await pilot.press("v")  # and the keys still work
            assert "data 42s old" in " ".join(c.plain for c in app.table.get_row("node:node02"))
            prober.release.set()
            await until(
                pilot,
                lambda: "⏱" not in " ".join(c.plain for c in app.table.get_row("node:node02")),
                "node02 to answer again",
            )
    finally:
        prober.release.set()


# -- what a new user read on the board ----------------------------------------------------------


def _small_board(tmp_path: Any) -> Any:
    """The snapshots' small cluster, read once as the board reads it (clocks pinned)."""
    from test_board_snapshots import services_for, small_cluster

    from gpuclaim.board.data import probe_node, read_board

    cluster = small_cluster(tmp_path)
    svc = services_for(cluster)
    samples = {n.name: probe_node(svc, n.name, None) for n in cluster.config.nodes}
    return read_board(svc, samples, fold_usage=False)


def _line_of(text: str, node: str, index: int) -> str:
    """The --once line of one GPU (a node's name is on its first GPU's line only)."""
    lines = text.splitlines()[2:]
    start = next(i for i, line in enumerate(lines) if line.startswith(node + " "))
    return next(line for line in lines[start:] if line.split()[0 if index else 1] == str(index))


def _detail(data: Any, node: str, index: int) -> str:
    from gpuclaim.board.widgets import detail_lines

    row = next(r for r in data.view.rows if (r.node, r.index) == (node, index))
    return " ".join(t.plain for t in detail_lines(row, data, "alice"))


@pytest.mark.parametrize("width", [80, 120, 200])
def test_a_jobs_gpu_names_the_job_once_not_again_as_its_note(tmp_path, width):
    """A job's claim is noted ``job NAME``: beside the JOB column that says nothing new."""
    from gpuclaim.board.text import render_text

    data = _small_board(tmp_path)
    line = _line_of(render_text(data, "alice", width=width), "node03", 1)
    assert line.count("resnet") == 1, line
    assert " job " not in line, line
    assert _detail(data, "node03", 1).count(" job resnet") == 1  # its tmux session aside
    assert "llama-7b fin" in _line_of(render_text(data, "alice", width=width), "node01", 2)


@pytest.mark.parametrize("width", [80, 120, 200])
def test_a_jobs_gpu_shows_the_jobs_own_time_left(tmp_path, width):
    """bob's resnet ran 30m of its 4h: 3h30m left, though its claim has 2 minutes more (the
    kill grace's margin), in the table, the compact view and the detail pane alike."""
    from gpuclaim.board.cells import left_text
    from gpuclaim.board.text import render_text

    data = _small_board(tmp_path)
    line = _line_of(render_text(data, "alice", width=width), "node03", 1)
    assert " 3h30m " in line and "3h31m" not in line, line
    compact = render_text(data, "alice", width=width, compact=True)
    who = next(line for line in compact.splitlines() if line.startswith("node03"))
    assert "1 bob 3h30m" in who, who
    assert "3h30m left" in _detail(data, "node03", 1)
    assert " 2h29m " in _line_of(render_text(data, "alice", width=width), "node01", 0)
    assert left_text(-1, job=True).plain == "ending"  # past its limit: being stopped
    assert left_text(-1).plain == "expired"


def test_a_jobs_time_left_on_the_board_is_what_gpuclaim_jobs_says(make_cluster):
    """The real CLI: ``run --time 2h``, then ``board --once`` and ``jobs`` agree."""
    from gpuclaim.core.durations import format_duration

    c = make_cluster({"bd01": 2}, fast=True)
    c.ok("run", "--node", "bd01", "--name", "train", "--time", "2h", "--", "sleep", "600")
    try:
        before = time.time()
        boards = [c.ok("board", "--once", "--size", size) for size in ("120x20", "80x20")]
        jobs_line = c.ok("jobs").splitlines()[1]
        after = time.time()
        job = next(j for j in json.loads(c.ok("jobs", "--json")) if j["name"] == "train")
    finally:
        c.ok("kill", "train")
    ends = parse_iso(job["ends"])
    lefts = {format_duration(ends - before), format_duration(ends - after)}  # a minute may tick
    assert any(f" {left} " in jobs_line for left in lefts), (lefts, jobs_line)
    for board in boards:
        line = next(line for line in board.splitlines() if "alice" in line)
        assert any(f" {left} " in line for left in lefts), (lefts, line)
        assert line.count("train") == 1, line


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_memory_is_never_cut_even_at_80_columns(tmp_path, width):
    """Used/total always whole (``0.7/4…`` said nothing): at 80 columns in whole GiB."""
    import re

    from gpuclaim.board.text import render_text

    text = render_text(_small_board(tmp_path), "alice", width=width)
    for node, index, total in [("node01", 0, 80), ("node03", 0, 45), ("node03", 1, 45)]:
        line = _line_of(text, node, index)
        assert re.search(rf"[━─] \d+(\.\d)?/{total}G ", line), line
    assert re.search(r" (0\.7|1)/45G ", _line_of(text, "node03", 1))  # 700 MiB: in use


def test_memory_numbers_fit_their_column_on_any_gpu():
    import re

    from gpuclaim.board.cells import MEMORY_BAR, MEMORY_WIDTH, memory_text

    for layout, width in MEMORY_WIDTH.items():
        for used, total in [(700, 81559), (102_400, 144_384), (144_000, 144_384), (0, 8192)]:
            cell = memory_text(used, total, width, MEMORY_BAR[layout]).plain
            assert len(cell) <= width and re.fullmatch(r"[━─]+ [\d.]+/[\d.]+G", cell), cell
    assert memory_text(700, 81559, 20, 11).plain == "━────────── 0.7/80G"  # room: a decimal
    assert memory_text(700, 81559, 11, 4).plain == "━─── 1/80G"


def test_the_detail_pane_names_the_holder_as_status_and_jobs_do(tmp_path):
    """By login name, as everywhere else; one's own claims marked so beside it."""
    data = _small_board(tmp_path)
    assert "held by alice (you) for 1h10m" in _detail(data, "node01", 0)
    assert "held by bob for 30m" in _detail(data, "node03", 1)


def test_a_preemptible_holder_is_marked_on_the_board_and_in_status(make_cluster):
    c = make_cluster({"bd01": 2}, fast=True)
    c.ok("run", "--preemptible", "--name", "scav", "--", "sleep", "60")
    deadline = time.monotonic() + 15
    while "claimed" not in c.ok("status"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    board = c.ok("board", "--once", "--size", "120x10")
    line = next(x for x in board.splitlines() if "scav" in x)
    assert "alice ⏏" in line, board
    assert "claimed (preemptible)" in c.ok("status")
    c.ok("kill", "scav")
