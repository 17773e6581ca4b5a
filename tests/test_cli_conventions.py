"""The feel of the CLI, checked command by command: --help everywhere and clean in a pipe,
--json wherever a list or an object is printed, --quiet where a command acts, colour and
spinners only on a terminal (and no colour with NO_COLOR), and every mistake a user can make
one line on stderr with the documented exit code."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import typer
from test_slack import FakeSlack, _with_slack

from gpuclaim import __version__
from gpuclaim.entry.main import build_app

ESC = "\x1b"
COLOUR = re.compile(r"\x1b\[[0-9;]*(?:3[0-9]|9[0-7]|4[0-9]|10[0-7])[0-9;]*m")


def command_paths() -> dict[tuple[str, ...], Any]:
    """Every command and sub-command of the live app (hidden aliases included)."""
    found: dict[tuple[str, ...], Any] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        found[path] = cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(build_app()), ())
    return found


COMMANDS = command_paths()
GROUPS = [p for p, c in COMMANDS.items() if hasattr(c, "commands")]
LEAVES = [p for p, c in COMMANDS.items() if not hasattr(c, "commands")]

# Commands that print a list or an object take --json; these print neither, and why.
NO_JSON = {
    ("logs",): "the job's own output, as it is",
    ("attach",): "becomes the tmux client",
    ("init",): "writes a file and names it",
    ("demo",): "a guided tour, for people",
    ("board",): "a screen (status --json has the data)",
    ("forward",): "a tunnel in the foreground (jobs --json has the service's url)",
    ("metrics",): "Prometheus's own text format (status --json has the data)",
    ("export", "slurm"): "writes files and names them",
    ("export", "sbatch"): "prints a script",
    ("policy", "set"): "changes one key and says so (policy show --json has the data)",
    ("policy", "unset"): "changes one key and says so (policy show --json has the data)",
}
# Commands that act take -q/--quiet: nothing but errors, the exit code says the rest.
QUIET = {
    "status",  # a look for its side effects (cron), printing nothing but errors
    "ls",
    "claim",
    "release",
    "extend",
    "run",
    "serve",
    "kill",
    "gc",
    "drain",
    "undrain",
    "pull",
    "reserve",
}


def options_of(path: tuple[str, ...]) -> set[str]:
    cmd = COMMANDS[path]
    return {name for p in cmd.params for name in (*p.opts, *p.secondary_opts)}


def plain_env(cluster: Any, **extra: str) -> dict[str, str]:
    """A user's environment in a pipe: no NO_COLOR, so the pipe alone must keep colour out."""
    env = cluster.env()
    env.pop("NO_COLOR", None)
    env.update(extra)
    return env


def run(cluster: Any, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuclaim", *args],
        env=plain_env(cluster, **env),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuclaim: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_every_command_has_clean_help_in_a_pipe(cluster: Any) -> None:
    def help_of(path: tuple[str, ...]) -> tuple[tuple[str, ...], Any]:
        return path, run(cluster, *path, "--help")

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(help_of, COMMANDS))
    assert len(results) > 25
    for path, proc in results:
        assert proc.returncode == 0, (path, proc.stderr)
        assert proc.stderr == "", (path, proc.stderr)
        assert proc.stdout.startswith(f"Usage: {' '.join(('gpuclaim', *path))} "), path
        assert ESC not in proc.stdout, path
        assert "╭" not in proc.stdout, path  # no rich boxes either
        # a command list shows each description whole, even at 80 columns in a pipe
        listed = proc.stdout.split("Commands:", 1)[1] if "Commands:" in proc.stdout else ""
        assert "..." not in listed, (path, listed)


def test_piped_tables_have_no_trailing_spaces(cluster: Any) -> None:
    cluster.ok("claim", "-n", "1", "--note", "x")
    cluster.ok("run", "--name", "t", "--", "true")
    for args in (["status"], ["jobs", "--all"], ["history"], ["history", "--claims"], ["doctor"]):
        proc = run(cluster, *args)
        assert proc.returncode in (0, 1), (args, proc.stderr)
        lines = proc.stdout.splitlines()
        assert len(lines) >= 2, (args, proc.stdout)
        assert [line for line in lines if line != line.rstrip()] == [], args


def test_history_of_claims_has_a_header_and_says_what_each_was_for(cluster: Any) -> None:
    cluster.ok("claim", "-n", "1", "--note", "bert sweep")
    cluster.ok("release", "--all")
    cluster.ok("run", "--name", "tiny", "--", "true")
    deadline = time.monotonic() + 20
    while "tiny" not in run(cluster, "history", "--claims").stdout:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    lines = run(cluster, "history", "--claims").stdout.splitlines()
    assert lines[0].split() == [
        "START", "END", "USER", "NODE", "GPUS", "GPU-H", "JOB", "NOTE", "CLAIM"
    ]  # fmt: skip
    assert any("bert sweep" in line for line in lines[1:])
    assert any(" tiny " in f" {line} " for line in lines[1:])
    rows = json.loads(run(cluster, "history", "--claims", "--json").stdout)
    assert {(r["job"], r["note"]) for r in rows} == {(None, "bert sweep"), ("tiny", None)}


def test_every_listing_prints_json(cluster: Any, tmp_path: Path) -> None:
    missing = {p for p in LEAVES if "--json" not in options_of(p)}
    assert missing == set(NO_JSON), "a new command prints a list or object: give it --json"

    def j(*args: str) -> Any:
        cut = args.index("--") if "--" in args else len(args)  # before a job's own arguments
        proc = run(cluster, *args[:cut], "--json", *args[cut:])
        assert proc.returncode == 0, (args, proc.stderr)
        assert ESC not in proc.stdout
        return json.loads(proc.stdout)

    claim = j("claim", "-n", "1")
    assert [r["state"] for r in j("status")].count("claimed") == 1
    assert j("extend", claim["id"], "--time", "1h")[0]["id"] == claim["id"]
    assert j("history")[0]["user"] == "alice"
    assert j("release", claim["id"])[0]["id"] == claim["id"]
    assert j("gc") == {
        "expired": [],
        "incomplete": [],
        "corrupt": [],
        "lost_jobs": [],
        "requeued": [],  # queued jobs whose queue entry was never written, put back
        "sync_copies_removed": {"node01": 0, "node02": 0},  # per node that answered
        "jobs_archived": 0,
        "bookings_dropped": 0,  # ended over [defaults] keep_reservations ago
        "damaged_bookings": [],
        "bookings_left": [],
    }
    assert j("drain", "node02", "--reason", "fan") == {
        "node": "node02",
        "drained": True,
        "reason": "fan",
        "user": "alice",
    }
    assert j("undrain", "node02")["was_drained"] is True
    assert j("config", "show")["nodes"] == ["node01", "node02"]
    assert {h["node"] for h in j("doctor")} == {"node01", "node02"}
    job = j("run", "--name", "sleepy", "--", "sleep", "30")
    assert any(r["name"] == "sleepy" for r in j("jobs"))
    assert j("kill", "sleepy")["name"] == job["name"]


def test_notify_test_json(cluster: Any) -> None:
    slack = FakeSlack()
    try:
        _with_slack(cluster, slack.url)
        answer = json.loads(cluster.ok("notify", "test", "--json"))
        assert answer["delivered"] is True and answer["status"] == 200
        slack.mode = "404"
        proc = cluster.cli("notify", "test", "--json")
        assert proc.returncode == 1
        assert json.loads(proc.stdout)["permanent"] is True
    finally:
        slack.close()


def test_quiet_prints_nothing_but_errors(cluster: Any) -> None:
    assert {p[0] for p in LEAVES if "--quiet" in options_of(p)} == QUIET
    for args in (
        ("claim", "-n", "1", "-q"),
        ("extend", "--all", "--time", "1h", "-q"),
        ("release", "--all", "--quiet"),
        ("run", "-q", "--name", "q", "--", "sleep", "30"),
        ("kill", "q", "-q"),
        ("serve", "-q", "--name", "s", "--", "sleep", "30"),
        ("kill", "s", "-q"),
        ("gc", "-q"),
        ("status", "-q"),
        ("drain", "node01", "-q"),
        ("undrain", "node01", "-q"),
        ("reserve", "-n", "1", "--start", "+1h", "--time", "1h", "-q"),
    ):
        proc = run(cluster, *args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", ""), args
    one_line_error(run(cluster, "claim", "-q", "-n", "9"), 1, "can never fit")


def test_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuclaim", "--version"], capture_output=True, text=True
    )
    assert (proc.returncode, proc.stdout) == (0, f"gpuclaim {__version__}\n")


def test_a_wrong_flag_on_every_command_is_one_line(cluster: Any) -> None:
    def wrong(path: tuple[str, ...]) -> tuple[tuple[str, ...], Any]:
        return path, run(cluster, *path, "--no-such-flag")

    with ThreadPoolExecutor(4) as pool:
        for path, proc in pool.map(wrong, [*LEAVES, ()]):
            where = " ".join(path) + " " if path else ""
            one_line_error(proc, 2, "No such option: --no-such-flag", f"'gpuclaim {where}--help'")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["notify"], ["'gpuclaim notify' needs a command: test"]),
        (["config"], ["'gpuclaim config' needs a command: show"]),
        (["export"], ["'gpuclaim export' needs a command: slurm, sbatch"]),
        (["frobnicate"], ["No such command 'frobnicate'"]),
        (["notify", "frob"], ["No such command 'frob'", "'gpuclaim notify --help'"]),
        (["claim", "-n"], ["'-n' requires an argument", "'gpuclaim claim --help'"]),
        (["--config", "x", "logs", "-n"], ["requires an argument", "'gpuclaim logs --help'"]),
        (["logs"], ["Missing argument 'NAME'", "'gpuclaim logs --help'"]),
        (["attach"], ["Missing argument 'NAME'"]),
        (["kill"], ["Missing argument 'NAME'"]),
        (["drain"], ["Missing argument 'NODE'"]),
        (["undrain"], ["Missing argument 'NODE'"]),
        (["run"], ["Missing argument"]),
        (["extend"], ["Missing option '--time'"]),
        (["export", "slurm"], ["Missing option '--out'"]),
        (["history", "--since", "2026-13-01"], ["is not a date: use YYYY-MM-DD"]),
        (["history", "--user", "bad name"], ["invalid user name 'bad name'"]),
        (["board", "--size", "huge"], ["--size wants WIDTHxHEIGHT"]),
    ],
)
def test_usage_mistakes_are_one_line_and_exit_2(
    cluster: Any, args: list[str], needles: list[str]
) -> None:
    one_line_error(run(cluster, *args), 2, *needles)


def test_gpuclaim_alone_shows_the_help(cluster: Any) -> None:
    proc = run(cluster)
    assert proc.returncode == 2 and proc.stderr == ""
    assert proc.stdout.startswith("Usage: gpuclaim [OPTIONS] COMMAND")


def test_debug_shows_the_traceback(cluster: Any) -> None:
    proc = run(cluster, "--debug", "claim", "--gpu", "bad")
    assert proc.returncode == 2
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert proc.stderr.splitlines()[-1].startswith("gpuclaim: error: --gpu wants NODE:INDEX")
    # a job's own --debug is the job's
    proc = run(cluster, "claim", "--gpu", "bad", "--", "--debug")
    assert "Traceback" not in proc.stderr


def test_paths_that_cannot_be_used_are_one_line(cluster: Any, tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    one_line_error(run(cluster, "demo", "--dir", str(a_file / "demo")), 1, "--dir")
    one_line_error(
        run(
            cluster,
            "--config",
            str(a_file / "cfg.toml"),
            "init",
            "--nodes",
            "n1",
            "--storage",
            "ssh://n1/srv/gc",
        ),
        1,
        f"cannot write the config {a_file / 'cfg.toml'}",
    )
    one_line_error(run(cluster, "board", "--once", "--svg", str(a_file / "b.svg")), 1, "b.svg")
    one_line_error(run(cluster, "export", "slurm", "--out", str(a_file / "out")), 1, "out")


def test_a_full_disk_is_one_line(cluster: Any) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuclaim", "status"],
            env=plain_env(cluster),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    one_line_error(proc, 1, "No space left on device")


def test_a_reader_that_leaves_is_no_error(cluster: Any) -> None:
    """`gpuclaim status | head -1`: exit 0, nothing on stderr (rich alone would exit 1)."""
    for args in (["status"], ["history"], ["status", "--json"]):
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuclaim", *args],
            env=plain_env(cluster),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # gone before the first line is written
        stderr = proc.stderr.read().decode()
        assert (proc.wait(timeout=60), stderr) == (0, ""), args


def _on_a_terminal(cluster: Any, *args: str, stream: str = "stdout", **env: str) -> str:
    """Run gpuclaim with stdout (or stderr) on a pseudo-terminal; what the terminal got."""
    master, slave = pty.openpty()
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, stream: slave}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuclaim", *args],
        env=plain_env(cluster, COLUMNS="200", TERM="xterm-256color", **env),
        stdin=subprocess.DEVNULL,
        **streams,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        seen += chunk
    proc.communicate(timeout=60)
    os.close(master)
    return seen.decode(errors="replace")


def test_colour_on_a_terminal_and_never_with_no_color(cluster: Any) -> None:
    cluster.ok("claim", "-n", "1")
    assert COLOUR.search(_on_a_terminal(cluster, "status"))  # the check can see colour
    shown = _on_a_terminal(cluster, "status", NO_COLOR="1")
    assert "claimed" in shown
    assert not COLOUR.search(shown)


def test_a_spinner_only_while_a_real_wait_on_a_terminal(make_cluster: Any) -> None:
    slow = make_cluster({"node01": 2})
    text = slow.config_path.read_text()
    slow.config_path.write_text(
        text.replace(
            'nvidia_smi = ["', 'nvidia_smi = ["sh", "-c", "sleep 1; exec \\"$0\\" \\"$@\\"", "'
        )
    )
    waited = _on_a_terminal(slow, "status", stream="stderr")
    assert "asking 1 node(s)" in waited
    piped = run(slow, "status")
    assert piped.returncode == 0 and piped.stderr == ""
    quick = make_cluster({"node01": 1}, fast=True)
    assert "asking" not in _on_a_terminal(quick, "status", stream="stderr")


def test_a_call_loads_only_its_command_and_means_the_same(cluster: Any) -> None:
    """`gpuclaim status --json` builds an app of that one command (the others' imports and
    typer's conversion are a third of a look's start); each such app must parse, help and
    complete exactly as the whole one, and the whole one is what help and typos get."""
    from gpuclaim.entry import main as entry

    whole = typer.main.get_command(build_app())
    for name in entry.COMMANDS:
        alone = typer.main.get_command(build_app(name))
        assert list(alone.commands) == [name]  # type: ignore[attr-defined]
        ctx = whole.make_context("gpuclaim", [name, "--help"], resilient_parsing=True)
        expected = whole.commands[name].get_help(ctx)  # type: ignore[attr-defined]
        ctx = alone.make_context("gpuclaim", [name, "--help"], resilient_parsing=True)
        assert alone.commands[name].get_help(ctx) == expected  # type: ignore[attr-defined]
    assert entry.app_for(["--config", "x.toml", "status", "--json"]) is build_app("status")
    assert entry.app_for(["--help"]) is build_app()
    assert entry.app_for(["statsu"]) is build_app()
    # what one call imports: nothing of the other commands, and no rich in a pipe; a look
    # (entry.fast) not even typer
    probe = (
        "import sys, runpy; sys.argv = ['gpuclaim', 'status', '--json'];"
        " from gpuclaim.entry.main import main; main();"
        " print([m for m in sys.modules if m.startswith(('gpuclaim.cli.', 'rich', 'typer'))],"
        " file=sys.stderr)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=plain_env(cluster), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    loaded = set(eval(done.stderr.strip().splitlines()[-1]))
    assert "gpuclaim.cli.status_show" in loaded
    assert not loaded & {"gpuclaim.cli.jobs", "gpuclaim.cli.admin", "gpuclaim.cli.claim"}
    assert not {m for m in loaded if m.startswith(("rich", "typer"))}
    # and a typo still lists every command
    typo = run(cluster, "statsu")
    assert typo.returncode == 2 and "No such command 'statsu'" in typo.stderr
