"""Bad input gets one clear line on stderr and the documented exit code, never a traceback."""

from __future__ import annotations

import json

import pytest


def _one_line_error(proc, code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gpuclaim: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["claim", "-n", "0"], 2, "-n"),
        (["claim", "-n", "two"], 2, "Invalid value for '-n'"),
        (["claim", "--time", "banana"], 2, "not a duration: 'banana'"),
        (["claim", "--time", "-5m"], 2, "duration"),
        (["claim", "--node", "node99"], 1, "unknown node 'node99'"),
        (["claim", "--gpu", "node01"], 2, "--gpu wants NODE:INDEX"),
        (["claim", "--gpu", "node01:x"], 2, "indices must be numbers"),
        (["claim", "--gpu", "node01:9"], 1, "node01 has no GPU 9"),
        (
            ["claim", "-n", "1", "--gpu", "node01:0"],
            2,
            "use one of -n, --gpu, --adopt and --reservation",
        ),
        (["claim", "--no-such-flag"], 2, "No such option"),
        (["release", "c-doesnotexist"], 1, "no claim 'c-doesnotexist'"),
        (["release"], 2, "name a claim id"),
        (["extend", "--time", "1h"], 2, "name a claim id"),
        (["history", "--by", "planet"], 2, "--by must be one of"),
        (["history", "--since", "yesterday-ish"], 2, "not a duration"),
        (["drain", "node42"], 1, "unknown node 'node42'"),
        (["frobnicate"], 2, "No such command"),
    ],
)
def test_bad_arguments(cluster, args, code, needle):
    _one_line_error(cluster.cli(*args), code, needle)


def test_hostile_user_name_is_refused(cluster):
    proc = cluster.cli("claim", "-n", "1", user="../../etc/passwd")
    _one_line_error(proc, 2, "invalid user name")


def test_note_with_control_characters_stays_one_line(cluster):
    claim = cluster.json("claim", "-n", "1", "--note", "line1\nline2\x1b[31mred")
    assert claim["note"] == "line1 line2 [31mred"
    proc = cluster.cli("status")
    assert "\x1b" not in proc.stdout


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("nodes = [", "invalid TOML"),
        ("nodes = 'node01'", "'nodes' must be a non-empty list"),
        ("nodes = []", "'nodes' must be a non-empty list"),
        ('nodes = ["a b"]', "not a valid host alias"),
        ('nodes = ["n1"]\nstorage = 5', "'storage' must be a path"),
        ('nodes = ["n1"]\nnodse = 1', "unknown key 'nodse'"),
        ('nodse = ["n1"]', "unknown key 'nodse' in the top level: did you mean 'nodes'?"),
        ('node = ["n1"]', "'node' must be a table ([node.NAME]): did you mean 'nodes'?"),
        ('nodes = ["n1"]\nstorage = "/x"\n[defaults]\ntmie = "1h"', "did you mean 'time'?"),
        ('nodes = ["n1"]\n[defaults]\ntime = "forever"', "not a duration"),
        ('nodes = ["n1"]\n[defaults]\nmax_gpus_per_user = -1', "whole number"),
        ('nodes = ["n1"]\n[node.n2]\nhost = "x"', "not in 'nodes'"),
        ('nodes = ["n1"]\n[slack]\nwebhook_url = "ftp://x"', "http(s) URL"),
    ],
)
def test_broken_config(cluster, text, needle):
    cluster.config_path.write_text(text)
    proc = cluster.cli("status")
    _one_line_error(proc, 1, str(cluster.config_path), needle)


def test_unreadable_config(cluster):
    cluster.config_path.write_bytes(b"\xff\xfe nodes")
    _one_line_error(cluster.cli("status"), 1, "not UTF-8")
    cluster.config_path.unlink()
    _one_line_error(cluster.cli("status"), 1, "does not exist", "gpuclaim init")
    cluster.config_path.mkdir()
    _one_line_error(cluster.cli("status"), 1, "cannot read config")


def test_corrupted_claim_file_is_shown_and_collected(cluster):
    claim = cluster.json("claim", "--gpu", "node01:1")
    path = cluster.storage / "gpus" / f"{claim['gpu_uuids'][0]}.claim"
    path.write_bytes(b'{"id": "c-half", "us')  # half-written, as after a disk filled up
    proc = cluster.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    row = {(r["node"], r["index"]): r for r in json.loads(proc.stdout)}[("node01", 1)]
    assert row["state"] == "stale"
    assert row["reason"].startswith("claim file corrupt")
    text = cluster.ok("status")
    assert "corrupt" in text
    report = cluster.json("gc")
    assert report["corrupt"] == [claim["gpu_uuids"][0]]
    kept = list((cluster.storage / "corrupt").iterdir())
    assert len(kept) == 1 and kept[0].read_bytes().startswith(b'{"id": "c-half"')
    assert cluster.by_gpu()[("node01", 1)]["state"] == "free"


def test_damaged_event_log_line_is_skipped_with_a_warning(cluster):
    c = cluster.json("claim", "-n", "1")
    cluster.ok("release", c["id"])
    log = next((cluster.storage / "events").iterdir())
    with log.open("ab") as fh:
        fh.write(b'{"ts": "2026-')
    proc = cluster.cli("history", "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)[0]["claims"] == 1
    assert "skipped 1 damaged line" in proc.stderr


def test_storage_that_cannot_be_created(cluster):
    text = cluster.config_path.read_text().replace(str(cluster.storage), "/nonexistent/dir/store")
    cluster.config_path.write_text(text)
    _one_line_error(cluster.cli("status"), 1, "storage /nonexistent/dir/store does not exist")


def test_driver_missing_node_is_a_row_and_exit_4(make_cluster):
    c = make_cluster({"node01": 2, "node02": 2})
    state = json.loads(c.state_path.read_text())
    state["nodes"]["node02"]["fail"] = True
    c.state_path.write_text(json.dumps(state))
    proc = c.cli("status", "--json")
    assert proc.returncode == 4
    rows = json.loads(proc.stdout)
    assert [r["state"] for r in rows] == ["free", "free", "unreachable"]
    assert "NVIDIA driver" in rows[2]["reason"]
    # Claims still work on the healthy node.
    assert c.json("claim", "-n", "2")["node"] == "node01"


@pytest.mark.parametrize(
    "args",
    [
        ["claim", "--gpu", "node01:0,0"],
        ["claim", "--gpu", "node01:1,0,1"],
        ["release", "--gpu", "node01:0", "--gpu", "node01:0"],
        ["release", "--gpu", "node01:2,2"],
    ],
)
def test_a_gpu_listed_twice_is_bad_input(cluster, args):
    _one_line_error(cluster.cli(*args), 2, "listed twice")
    assert all(r["state"] == "free" for r in cluster.status())
