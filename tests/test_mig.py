"""[share] MIG slices as GPUs of their own, through the real CLI on the sshd testbed: a node
whose GPU 0 is in MIG mode (the slices of fixture 05: 3g.40gb, 2g.20gb, 2x 1g.10gb) and
whose GPU 1 is whole. Each slice is claimable on its own (by profile or by ``NODE:0/1``), a
job sees exactly its slice's MIG UUID, and the parent GPU is never handed out whole. Both
ways a node is read: ``nvidia-smi -q -x`` with ``-L`` (shell look and agent), and NVML."""

from __future__ import annotations

import time
from typing import Any

import pytest

from gpuclaim.sim.fake_nvidia_smi import sim_uuid
from gpuclaim.sim.fake_report import sim_mig_uuid

PROFILES = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]  # fixture 05's H100
SLICE = {f"0/{n}": sim_mig_uuid("node01", 0, n) for n in range(4)}
PRINT = "import os; print('visible=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True)"


def _mig_node(make_testbed: Any, make_remote: Any, nvml: bool) -> Any:
    tb = make_testbed(1, 2, nvml=nvml)
    tb.set_gpus("node01", [{"mig": PROFILES}, {}])
    return make_remote(tb, kill_grace="2s", heartbeat="1s")


@pytest.fixture(params=[False, True], ids=["nvidia-smi", "nvml"])
def mig_node(request: Any, make_testbed: Any, make_remote: Any) -> Any:
    return _mig_node(make_testbed, make_remote, request.param)


@pytest.fixture
def mig_smi(make_testbed: Any, make_remote: Any) -> Any:
    return _mig_node(make_testbed, make_remote, False)


def _rows(c: Any, user: str = "alice") -> dict[str, dict[str, Any]]:
    return {r["gpu"]: r for r in c.status(user)}


def _job(c: Any, name: str, user: str = "alice") -> dict[str, Any]:
    return next(j for j in c.json("jobs", "--all", user=user) if j["name"] == name)


def _until(c: Any, name: str, states: set[str], timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = _job(c, name)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"{name} is {job['state']}: {job.get('reason')}"
        time.sleep(0.3)


def _seen(c: Any, name: str) -> str:
    deadline = time.monotonic() + 20
    while True:
        log = c.ok("logs", name, "-n", "0")
        if "visible=" in log:
            return log.split("visible=", 1)[1].split()[0]
        assert time.monotonic() < deadline, log
        time.sleep(0.3)


def test_slices_are_gpus_of_their_own_and_the_parent_is_never_whole(mig_node):
    c = mig_node
    rows = _rows(c)
    assert list(rows) == ["0/0", "0/1", "0/2", "0/3", "1"], rows
    for n, profile in enumerate(PROFILES):
        row = rows[f"0/{n}"]
        assert (row["uuid"], row["mig"], row["mig_profile"]) == (SLICE[f"0/{n}"], n, profile)
        assert row["state"] == "free" and row["index"] == 0
        assert row["memory_total_mib"] == int(profile.split(".")[1][:-2]) * 1024 - 256
    assert rows["1"]["uuid"] == sim_uuid("node01", 1) and rows["1"]["mig"] is None
    text = c.ok("status")
    assert "0/0" in text and "3g.40gb" in text and "5/5 GPUs free" in text, text

    # a plain claim takes the whole GPU 1, never GPU 0 in MIG mode: a second has none left
    whole = c.json("claim", "-n", "1", "--time", "10m")
    assert whole["gpu_uuids"] == [sim_uuid("node01", 1)], whole
    again = c.cli("claim", "-n", "1", "--time", "10m", user="bob")
    assert again.returncode == 3, again.stderr
    assert "no node has 1 GPU free" in again.stderr and "Traceback" not in again.stderr
    two = c.cli("claim", "-n", "2", "--time", "10m", user="bob")
    assert two.returncode == 1 and "can never fit" in two.stderr, two.stderr  # never fits
    by_index = c.cli("claim", "--gpu", "node01:0", "--time", "10m", user="bob")
    assert by_index.returncode == 1, by_index.stderr
    assert "node01 has no GPU 0 (it has 0/0, 0/1, 0/2, 0/3, 1)" in by_index.stderr

    # by profile and by NODE:GPU/SLICE, each slice on its own
    small = c.json("claim", "--mig", "1g.10gb", "--time", "10m", user="bob")
    other = c.json("claim", "--mig", "1g.10gb", "--time", "10m", user="carol")
    assert {small["gpu_uuids"][0], other["gpu_uuids"][0]} == {SLICE["0/2"], SLICE["0/3"]}
    assert small["gpu_migs"] in ([2], [3]) and small["gpus"] == [0]
    full = c.cli("claim", "--mig", "1g.10gb", "--time", "10m", user="dave")
    assert full.returncode == 3 and "1g.10gb slice" in full.stderr, full.stderr
    named = c.json("claim", "--gpu", "node01:0/1", "--time", "10m", user="dave")
    assert named["gpu_uuids"] == [SLICE["0/1"]]
    shown = c.ok("claim", "--gpu", "node01:0/0", "--time", "10m", user="erin")
    assert "GPU 0/0" in shown and f"CUDA_VISIBLE_DEVICES={SLICE['0/0']}" in shown, shown
    rows = _rows(c)
    holders = {label: (r["claim"] or {}).get("user") for label, r in rows.items()}
    assert holders == {
        "0/0": "erin",
        "0/1": "dave",
        "0/2": holders["0/2"],
        "0/3": holders["0/3"],
        "1": "alice",
    }
    assert {holders["0/2"], holders["0/3"]} == {"bob", "carol"}
    assert "0/5 GPUs free" in c.ok("status")
    # a slice is released by its label, as it is shown
    c.ok("release", "--gpu", "node01:0/1", user="dave")
    assert _rows(c)["0/1"]["state"] == "free"


def test_a_job_sees_its_slices_mig_uuid_and_queues_for_a_busy_profile(mig_smi):
    c = mig_smi
    script = PRINT + "; import time; time.sleep(600)"
    first = c.json("run", "--mig", "1g.10gb", "--name", "m1", "--", "python3", "-c", script)
    second = c.json("run", "--mig", "1g.10gb", "--name", "m2", "--", "python3", "-c", script)
    got = {}
    for job in (first, second):
        assert job["state"] == "running", job
        got[job["name"]] = _seen(c, job["name"])
    assert set(got.values()) == {SLICE["0/2"], SLICE["0/3"]}, got
    # the driver (the fake, as nvidia-smi -q -x says it) puts each in its own slice: the row
    # of a slice lists its job's process, and the 3g.40gb slice and GPU 1 stay free (a look
    # may show a GPU read taken just before the jobs' processes started: the next one has them)
    deadline = time.monotonic() + 20
    while True:
        rows = _rows(c)
        if all(rows[label]["processes"] for label in ("0/2", "0/3")):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    for label in ("0/2", "0/3"):
        assert rows[label]["state"] == "claimed"
        assert [p["name"] for p in rows[label]["processes"]] == ["python3"], rows[label]
        assert rows[label]["memory_used_mib"] == 1024
    assert rows["0/0"]["state"] == "free" and rows["1"]["state"] == "free"
    assert rows["0/0"]["processes"] == [] and rows["1"]["processes"] == []

    # a third waits for a 1g.10gb slice, saying so, though GPU 1 and 0/0 are free
    third = c.json(
        "run", "--mig", "1g.10gb", "--queue", "--name", "m3", "--", "python3", "-c", PRINT
    )
    assert third["state"] == "queued", third
    why = c.ok("jobs", "--all")
    assert "1g.10gb slice" in why, why
    c.ok("kill", "m1")
    done = _until(c, "m3", {"succeeded"}, timeout=40)
    assert done["exit_code"] == 0
    assert _seen(c, "m3") == got["m1"]
    c.ok("kill", "m2")
    _until(c, "m2", {"killed"})
    assert all(r["state"] == "free" for r in c.status())

    # a profile the node does not have: one line, exit 1 (never fits), nothing claimed
    none = c.cli("run", "--mig", "7g.80gb", "--", "true")
    assert none.returncode == 1 and "no MIG slices of 7g.80gb" in none.stderr, none.stderr
    assert "3g.40gb, 2g.20gb, 1g.10gb" in none.stderr
    bad = c.cli("run", "--mig", "big", "--", "true")
    assert bad.returncode == 2 and "--mig wants a MIG profile" in bad.stderr, bad.stderr
    both = c.cli("run", "--mig", "1g.10gb", "--gpu", "node01:0/2", "--", "true")
    assert both.returncode == 2, both.stderr


def test_export_slurm_writes_slices_as_autodetect_nvml_types_them(mig_smi, tmp_path):
    c = mig_smi
    job = c.json("run", "--mig", "2g.20gb", "--name", "m1", "--", "python3", "-c", PRINT)
    _until(c, "m1", {"succeeded"})
    out = tmp_path / "slurm"
    c.ok("export", "slurm", "--out", str(out))
    conf = (out / "slurm.conf").read_text()
    node = next(line for line in conf.splitlines() if line.startswith("NodeName="))
    # the slices by profile, the whole GPU 1 by its model; GPU 0 itself is no GRES
    assert "Gres=gpu:3g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb:2,gpu:h100:1 " in node, node
    gres = (out / "gres.conf").read_text()
    files = [line for line in gres.splitlines() if "File=" in line and not line.startswith("#")]
    assert len(files) == 1 and "Type=h100 File=/dev/nvidia1" in files[0], gres
    assert "MIG slices (1 3g.40gb, 1 2g.20gb, 2 1g.10gb)" in gres
    assert "## MIG slices" in (out / "MIGRATION.md").read_text()
    script = c.ok("export", "sbatch", "m1")
    assert "#SBATCH --gres=gpu:2g.20gb:1" in script, script
    assert job["state"] in ("starting", "running", "succeeded")
