"""The export, proven by a real SLURM: jobs run through gpuclaim on SSH testbed nodes (each a
host with a hostname of its own, unlike its SSH alias), then `gpuclaim export slurm` and
`export sbatch` through the CLI, then slurmctld and one slurmd per node (Debian's packages;
tests/slurm_testbed.py) run those files as exported and the exported scripts; slurmd finds
each node's line by its hostname, as on the real machine. The slurmdbd variant has no
database here: slurmctld and slurmdbd show they accept its files up to the database.

A machine without SLURM fails here with the packages to install: CI proves the export.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest
from slurm_testbed import (
    CTLD_NO_DATABASE,
    DBD_NO_DATABASE,
    MissingSlurm,
    SlurmTestbed,
    SlurmTestbedError,
    can_rename,
)
from testbed_fixtures import wrap_sshd

from gpuclaim.app.slurm import (
    ExportOptions,
    GpuSlot,
    NodeSpec,
    render_cgroup_conf,
    render_gres_conf,
    render_sbatch,
    render_slurm_conf,
)
from gpuclaim.core.model import Job
from gpuclaim.node.hardware import probe_hardware

# One pytest worker runs the real SLURMs one at a time: slurmd and slurmstepd share this
# machine's cgroups (and default ports) between testbeds.
pytestmark = pytest.mark.xdist_group("slurm")

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100 80GB PCIe"
A10 = "NVIDIA A10"  # "a10" is a substring of every A100's name: slurmd must still tell them apart
# Each SSH testbed node (its alias) is a machine with a hostname of its own, as SLURM names it.
HOSTS = {"node01": "gpu01", "node02": "gpu02", "node03": "ws7"}
GPUS = {"gpu01": [H100, H100], "gpu02": [H100, H100], "ws7": [A100, A10]}

PRINT_JOB = (
    "import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(), "
    "'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), 'env': os.environ.get('HOSTILE'), "
    "'order': os.environ.get('CUDA_DEVICE_ORDER')}))"
)
HOSTILE_ARGS = ["it's", 'a "b"', "$HOME", "`id`", "back\\slash", "#x", "", "two\nlines", "*"]
HOSTILE_ENV = "x y 'z' $HOME \"q\""

# torch.distributed.run as far as SLURM is concerned: it reports how it was started, then runs
# the script once (real torch would start --nproc_per_node workers after the rendezvous).
TORCH_STUB = """\
import json, os, subprocess, sys
args = sys.argv[1:]
i = next(i for i, a in enumerate(args) if not a.startswith("--"))
print(json.dumps({"launcher": args[:i], "node": os.environ["SLURMD_NODENAME"],
                  "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)
sys.exit(subprocess.call([sys.executable, *args[i:]]))
"""
TRAIN = "import json, sys; print(json.dumps({'script_args': sys.argv[1:]}), flush=True)\n"


@pytest.fixture
def slurm(tmp_path):
    """Starts SLURM on the files of an export dir; always stopped after the test."""
    started: list[SlurmTestbed] = []
    roots: list[Path] = []

    def up(export_dir: Path, gpus: dict[str, list[str]]) -> SlurmTestbed:
        # short on purpose, as the sshd testbed's: slurmstepd's sockets live in its spool and
        # sun_path holds 108 bytes (a pytest-xdist worker's tmp_path is longer by 10)
        root = Path(tempfile.mkdtemp(prefix=f"gcsl{len(started)}-", dir="/tmp"))
        roots.append(root)
        try:
            tb = SlurmTestbed.up(export_dir, gpus, root)
        except MissingSlurm as exc:
            missing = str(exc)
        else:
            started.append(tb)
            return tb
        pytest.fail(missing, pytrace=False)

    yield up
    for tb in started:
        tb.down()
    for root in roots:  # the logs stay with the test's tmp_path, for a failure's reader
        if (root / "log").is_dir():
            shutil.copytree(root / "log", tmp_path / f"{root.name}-log", dirs_exist_ok=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def named_testbed(make_testbed, monkeypatch, tmp_path):
    """Three SSH testbed nodes that are three hosts: each sshd runs in a UTS namespace of its
    own named as HOSTS says, so the agent there reports that hostname, not the SSH alias."""
    if not can_rename():
        pytest.fail("hosts with names of their own need root (unshare --uts)", pytrace=False)
    # each sshd in a UTS namespace named after the testbed node it serves
    rename = 'unshare --uts sh -c \'hostname "$0" && exec "$@"\''
    wrap_sshd(monkeypatch, tmp_path / "bin", {a: f"{rename} {h}" for a, h in HOSTS.items()})
    tb = make_testbed(3, 2)
    for alias, host in HOSTS.items():  # the renaming took
        assert tb.ssh(alias, "hostname").stdout.strip() == host
    return tb


def _wait_job(c, name, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        job = next(j for j in c.json("jobs", "--all") if j["name"] == name)
        if job["state"] not in ("queued", "starting", "running"):
            return job
        assert time.monotonic() < deadline, f"{name} still {job['state']}"
        time.sleep(0.3)


def test_exported_config_and_scripts_run_on_a_real_slurm(
    named_testbed, make_remote, slurm, tmp_path
):
    testbed = named_testbed
    t0 = time.monotonic()
    for alias, host in HOSTS.items():
        testbed.set_gpus(alias, [{"name": n, "memory_total_mib": 81920} for n in GPUS[host]])
    c = make_remote(testbed)

    # Two jobs through gpuclaim: a hostile single-GPU one on the A100/A10 node, a gang job.
    work = tmp_path / 'work dir #1 "q"'
    work.mkdir()
    single = c.json(
        *("run", "--node", "node03", "--name", "single", "-C", str(work)),
        *("-e", f"HOSTILE={HOSTILE_ENV}", "--", "python3", "-c", PRINT_JOB, *HOSTILE_ARGS),
    )
    gang_dir = tmp_path / "gang"
    (gang_dir / "torch" / "distributed").mkdir(parents=True)
    (gang_dir / "torch" / "__init__.py").write_text("")
    (gang_dir / "torch" / "distributed" / "__init__.py").write_text("")
    (gang_dir / "torch" / "distributed" / "run.py").write_text(TORCH_STUB)
    (gang_dir / "train.py").write_text(TRAIN)
    gang = c.json(
        *("run", "--nodes", "2", "-n", "2", "--name", "gang", "-C", str(gang_dir)),
        *("--", "python3", "train.py", "--lr", "0.1", "a b"),
    )
    assert sorted(gang["nodes"]) == ["node01", "node02"]
    assert _wait_job(c, "single")["state"] == "succeeded"
    assert _wait_job(c, "gang")["state"] == "succeeded"
    under_gpuclaim = json.loads(c.ok("logs", "single", "-n", "0").strip().splitlines()[-1])
    t_jobs = time.monotonic()

    # The export, through the CLI.
    export = tmp_path / "export"
    proc = c.cli("export", "slurm", "--out", str(export))
    assert proc.returncode == 0, proc.stderr
    scripts = tmp_path / "scripts"
    proc = c.cli("export", "sbatch", "--history", "1", "--out", str(scripts))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in scripts.iterdir()) == ["gang.sbatch", "single.sbatch"]
    conf = (export / "slurm.conf").read_text()
    # named by the hostnames the nodes reported, not by their SSH aliases
    assert re.search(r"^NodeName=gpu\[01-02\] .*Gres=gpu:h100:2 State", conf, re.MULTILINE)
    assert re.search(r"^NodeName=ws7 .*Gres=gpu:a100:1,gpu:a10:1 State", conf, re.MULTILINE)
    assert "# gpuclaim's names: node01 is gpu01, node02 is gpu02, node03 is ws7." in conf
    # the testbed's nodes are reached at 127.0.0.1, which is no NodeAddr for another machine
    assert not re.search(r"^NodeName=.* NodeAddr=", conf, re.MULTILINE)
    assert "ws7 at 127.0.0.1, a loopback address" in conf
    t_export = time.monotonic()

    # SLURM runs the exported files: every node idle with its Gres, every GPU matched, and
    # each slurmd found its line by its hostname (no -N).
    tb = slurm(export, GPUS)
    t_up = time.monotonic()
    assert tb.found_by == dict.fromkeys(GPUS, "hostname")
    parts = tb.run("sinfo", "-h", "-o", "%P %D %G")
    assert parts.split()[0] == "h100*"
    ctld_log = (tb.root / "log" / "slurmctld.log").read_text()
    assert "can only be used with SlurmDBD" not in ctld_log  # no setting silently dropped

    (work / "logs").mkdir()
    single_id = tb.sbatch(scripts / "single.sbatch", cwd=tmp_path)
    (gang_dir / "logs").mkdir()
    gang_id = tb.sbatch(scripts / "gang.sbatch", cwd=tmp_path)
    for job_id in (single_id, gang_id):
        fields = tb.wait(job_id)
        assert fields["JobState"] == "COMPLETED", fields

    under_slurm = json.loads((work / "logs" / f"{single_id}.out").read_text().strip())
    assert under_slurm["argv"] == HOSTILE_ARGS == under_gpuclaim["argv"]
    assert under_slurm["env"] == HOSTILE_ENV == under_gpuclaim["env"]
    assert under_slurm["cwd"] == str(work) == under_gpuclaim["cwd"]
    assert under_slurm["order"] == "PCI_BUS_ID"
    # the same GPU model on node03, at the same index: SLURM's CUDA_VISIBLE_DEVICES is gpuclaim's
    assert under_slurm["cvd"] == under_gpuclaim["cvd"] == ",".join(map(str, single["gpus"]))

    lines = [json.loads(x) for x in (gang_dir / "logs" / f"{gang_id}.out").read_text().splitlines()]
    launchers = sorted((x for x in lines if "launcher" in x), key=lambda x: x["node"])
    assert [x["node"] for x in launchers] == ["gpu01", "gpu02"]
    for x in launchers:
        assert x["cvd"] == "0,1"
        assert x["launcher"][:2] == ["--nnodes=2", "--nproc_per_node=2"]
        assert x["launcher"][2:4] == [f"--rdzv_id={gang_id}", "--rdzv_backend=c10d"]
        assert re.fullmatch(r"--rdzv_endpoint=127\.0\.0\.1:\d+", x["launcher"][4])
    assert [x["script_args"] for x in lines if "script_args" in x] == [["--lr", "0.1", "a b"]] * 2

    # `gpuclaim history` as MIGRATION.md translates it: both jobs, from the job-completion log
    history = _history_command(export / "MIGRATION.md")
    assert history.startswith("sacct -c ")
    rows = {r.split()[0]: r.split() for r in tb.run(*shlex.split(history)).splitlines()[2:]}
    me = pwd.getpwuid(os.getuid()).pw_name
    for job_id, want in (
        (single_id, ["single", "a100", "ws7", "COMPLETED"]),
        (gang_id, ["gang", "h100", "gpu[01-02]", "COMPLETED"]),
    ):
        row = rows[str(job_id)]
        assert row[1].startswith(me) and row[2:6] == want, rows
    t_end = time.monotonic()
    print(
        f"timings: gpuclaim jobs {t_jobs - t0:.1f}s, export {t_export - t_jobs:.1f}s, "
        f"SLURM up {t_up - t_export:.1f}s, two sbatch jobs {t_end - t_up:.1f}s"
    )


def _history_command(migration: Path) -> str:
    """The SLURM command MIGRATION.md gives for `gpuclaim history`."""
    m = re.search(r"^\| `gpuclaim history` \| `([^`]+)` \|", migration.read_text(), re.MULTILINE)
    assert m, "no `gpuclaim history` row in MIGRATION.md"
    return m.group(1)


def _this_machine_export(
    tmp_path: Path, opts: Optional[ExportOptions] = None, shards: int = 0
) -> Path:
    """The export for GPUS on this machine's real hardware, rendered directly (fast): one
    machine per node, each with the node's name as its hostname."""
    hw = probe_hardware()
    nodes = [
        NodeSpec(
            name,
            name,
            hw["cpus"],
            hw["sockets"],
            hw["cores_per_socket"],
            hw["threads_per_core"],
            hw["real_memory_mib"],
            tuple(GpuSlot(i, g, i) for i, g in enumerate(gpus)),
        )
        for name, gpus in GPUS.items()
    ]
    out = tmp_path / "export"
    out.mkdir()
    (out / "slurm.conf").write_text(render_slurm_conf(nodes, opts or ExportOptions("testbed")))
    (out / "gres.conf").write_text(render_gres_conf(nodes, shards))
    (out / "cgroup.conf").write_text(render_cgroup_conf())
    return out


def _break(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path.name}"
    path.write_text(text.replace(old, new))


BROKEN = {
    # a GPU type that is not a substring of the name NVML reports: slurmd cannot match it
    "type not in the product name": [
        ("gres.conf", "Type=a10 ", "Type=a10x "),
        ("slurm.conf", "gpu:a10:1", "gpu:a10x:1"),
    ],
    # types are case-sensitive between slurm.conf and what slurmd reports
    "type case differs": [("gres.conf", "Type=h100", "Type=H100")],
    # without GresTypes, slurmctld silently drops every node's GPUs
    "no GresTypes": [("slurm.conf", "GresTypes=gpu\n", "")],
    # more GPUs than the node has
    "GPU count": [("slurm.conf", "Gres=gpu:h100:2", "Gres=gpu:h100:3")],
    # slurmctld parses cgroup.conf even without the cgroup plugins this container lacks
    "unknown cgroup.conf key": [("cgroup.conf", "ConstrainDevices=yes", "ConstrainGPUs=yes")],
    # a node bigger than the machine (what a wrong hardware probe would write)
    "more memory than the machine": [("slurm.conf", "RealMemory=", "RealMemory=9")],
    # what the export used to write without slurmdbd: slurmctld dies at once on each
    "GPU TRES without slurmdbd": [
        ("slurm.conf", "JobCompType=", "AccountingStorageTRES=gres/gpu\nJobCompType="),
    ],
    "GPU billing without slurmdbd": [
        ("slurm.conf", " State=UP", ' TRESBillingWeights="GRES/gpu=1.0" State=UP'),
    ],
    "slurmdbd that is not there": [
        (
            "slurm.conf",
            "AccountingStorageType=accounting_storage/none",
            "AccountingStorageType=accounting_storage/slurmdbd",
        ),
    ],
    # partition_prio preempts by tier and needs a mode to preempt with
    "preemption by partition with PreemptMode=OFF": [
        ("slurm.conf", "PreemptMode=REQUEUE\nJobRequeue", "PreemptMode=OFF\nJobRequeue"),
    ],
    # slurmctld only logs that it ignores fair share without slurmdbd: the testbed refuses it
    "fair share without slurmdbd": [
        (
            "slurm.conf",
            "PriorityType=priority/basic",
            "PriorityType=priority/multifactor\nPriorityWeightFairshare=10000",
        ),
    ],
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_export_is_refused(case, slurm, tmp_path):
    export = _this_machine_export(tmp_path)
    for name, old, new in BROKEN[case]:
        _break(export / name, old, new)
    with pytest.raises(SlurmTestbedError) as refused:
        slurm(export, GPUS)
    lines = str(refused.value).splitlines()
    print(f"{case}: {next((x for x in lines if 'fatal:' in x), lines[0])}")


def test_the_unbroken_export_of_this_machine_comes_up(slurm, tmp_path):
    # the control for the cases above: the same files, unbroken, are accepted
    tb = slurm(_this_machine_export(tmp_path), GPUS)
    assert "idle" in tb.run("sinfo", "-h", "-o", "%T")


# A scavenger that saves on its signal and on SIGTERM: each line one thing it saw, in order.
SCAV_TASK = """\
import json, os, signal, sys, time
def note(what):
    with open(sys.argv[1], "a") as f:
        f.write(json.dumps({"what": what, "t": time.time(), "node": os.environ["SLURMD_NODENAME"],
                            "restart": os.environ.get("GPUCLAIM_RESTART_COUNT")}) + "\\n")
def term(n, f):
    note("TERM"); sys.exit(0)
signal.signal(signal.SIGUSR1, lambda n, f: note("USR1"))
signal.signal(signal.SIGUSR2, lambda n, f: note("USR2"))
signal.signal(signal.SIGTERM, term)
note("start")
while True:
    time.sleep(0.05)
"""


def _fields(text: str) -> dict[str, str]:
    return dict(f.split("=", 1) for f in text.split() if "=" in f)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_preemptible_jobs_yield_their_gpus_on_a_real_slurm(slurm, tmp_path):
    """The scavenger partition as exported (GraceTime=2 from preempt_grace): a job of another
    partition needs the GPUs of two exported preemptible jobs. Each gets its own signal at
    once and SIGTERM after the grace; the --requeue one goes back to the queue, the other
    ends PREEMPTED; then the other job runs. slurmctld ends a grace at its time-limit check,
    every 30 s: this test takes about that long."""
    opts = ExportOptions("testbed", preempt_grace_s=2, kill_wait_s=2)
    tb = slurm(_this_machine_export(tmp_path, opts), GPUS)
    part = _fields(tb.run("scontrol", "-o", "show", "partition", "scavenger"))
    assert part["PreemptMode"] == "REQUEUE" and part["GraceTime"] == "2"
    assert part["PriorityTier"] == "0" and part["Nodes"] == "gpu[01-02],ws7"
    assert _fields(tb.run("scontrol", "-o", "show", "partition", "h100"))["PriorityTier"] == "1"
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    ids, notes = {}, {}
    for name, requeue, sig in (("again", True, "USR2"), ("once", False, "USR1")):
        notes[name] = work / f"{name}.jsonl"
        job = Job(
            id=f"j-{name}",
            name=name,
            user="alice",
            argv=("python3", "-c", SCAV_TASK, str(notes[name])),
            state="succeeded",
            submitted=0.0,
            time_limit_s=3600,
            gpus_per_node=2,  # a whole H100 node each
            workdir=str(work),
            preemptible=True,
            requeue=requeue,
            preempt_signal=sig,
        )
        script = work / f"{name}.sbatch"
        script.write_text(render_sbatch(job, "h100", "h100", preempt_grace_s=2))
        ids[name] = tb.sbatch(script, cwd=work)
    deadline = time.monotonic() + 30
    while not all(_lines(p) for p in notes.values()):
        assert time.monotonic() < deadline, tb.run("squeue")
        time.sleep(0.1)
    # a job of the h100 partition that needs both H100 nodes
    preemptor = int(
        tb.run(
            *("sbatch", "--parsable", "-p", "h100", "-N", "2", "--gres=gpu:h100:2"),
            *("-o", str(work / "logs" / "preemptor.out"), "--wrap", "true"),
        ).split(";")[0]
    )
    asked = time.time()
    assert tb.wait(preemptor, timeout=60)["JobState"] == "COMPLETED"
    for name, sig in (("again", "USR2"), ("once", "USR1")):
        seen = _lines(notes[name])
        assert [x["what"] for x in seen] == ["start", sig, "TERM"], seen
        assert seen[0]["restart"] == "0" and seen[0]["node"] in ("gpu01", "gpu02")
        assert seen[1]["t"] - asked < 5  # the signal at once
        assert 2 <= seen[2]["t"] - seen[1]["t"] < 2 + 30 + 3  # GraceTime, then SIGTERM
    again = _fields(tb.run("scontrol", "-o", "show", "job", str(ids["again"])))
    assert again["JobState"] in ("PENDING", "REQUEUED") and again["Restarts"] == "1", again
    assert again["Partition"] == "scavenger"
    once = _fields(tb.run("scontrol", "-o", "show", "job", str(ids["once"])))
    assert once["JobState"] == "PREEMPTED" and once["Restarts"] == "0", once
    tb.run("scancel", str(ids["again"]))


def test_shares_become_shards_a_real_slurm_runs_side_by_side(slurm, tmp_path):
    """export slurm --shards 4: each GPU four shards. Two exported --gpu-mem jobs (a quarter
    and a half of a GPU) run on one node's shards at once; slurmctld counts them."""
    opts = ExportOptions("testbed", shards_per_gpu=4)
    tb = slurm(_this_machine_export(tmp_path, opts, shards=4), GPUS)
    node = _fields(tb.run("scontrol", "-o", "show", "node", "gpu01"))
    assert "shard:h100:8" in node["Gres"], node
    work = tmp_path / "work"
    (work / "logs").mkdir(parents=True)
    ids = {}
    for name, share in (("quarter", 0.25), ("half", 0.5)):
        job = Job(
            id=f"j-{name}",
            name=name,
            user="alice",
            argv=("sh", "-c", f"date +%s.%N > {work / name}.start; sleep 4"),
            state="succeeded",
            submitted=0.0,
            time_limit_s=600,
            workdir=str(work),
            gpu_share=share,
        )
        script = render_sbatch(job, "h100", "h100", shards_per_gpu=4)
        assert f"#SBATCH --gres=shard:{int(share * 4)}" in script, script
        (work / f"{name}.sbatch").write_text(script)
        sent = tb.run(
            *("sbatch", "--parsable", "-w", "gpu01", "--mem=100M", "-c", "1"),
            str(work / f"{name}.sbatch"),
            cwd=work,
        )  # a little memory and a core each: the node holds both
        ids[name] = int(sent.strip().split(";")[0])
    starts = {}
    for name in ids:
        assert tb.wait(ids[name])["JobState"] == "COMPLETED"
        starts[name] = float((work / f"{name}.start").read_text())
    assert abs(starts["quarter"] - starts["half"]) < 3, starts  # side by side: 4 s each


def test_hardware_probe_agrees_with_slurmd(tmp_path):
    if shutil.which("slurmd") is None:
        pytest.fail("slurmd not found: apt-get install slurmd", pytrace=False)
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    hw = probe_hardware()
    assert hw["cpus"] == int(fields["CPUs"])
    sockets = int(fields["SocketsPerBoard"]) * int(fields.get("Boards", 1))
    assert (hw["sockets"], hw["cores_per_socket"], hw["threads_per_core"]) == (
        sockets,
        int(fields["CoresPerSocket"]),
        int(fields["ThreadsPerCore"]),
    )
    assert hw["mem_total_mib"] == int(fields["RealMemory"])
    assert hw["real_memory_mib"] < int(fields["RealMemory"])


def _conf(path: Path) -> dict[str, str]:
    """key=value of a SLURM config file (first value of each key; NodeName lines left out)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            if key not in ("NodeName", "PartitionName"):
                out.setdefault(key, value)
    return out


def test_slurmdbd_export_is_accepted_up_to_the_database(make_cluster, tmp_path):
    c = make_cluster({"node01": 2})
    export = tmp_path / "dbd"
    proc = c.cli("export", "slurm", "--accounting", "slurmdbd", "--out", str(export))
    assert proc.returncode == 0, proc.stderr
    assert (export / "slurmdbd.conf").stat().st_mode & 0o777 == 0o600

    # slurmdbd reads its file (mode and all) and loads its plugins: it waits for MariaDB;
    # slurmctld reads slurm.conf and loads accounting_storage/slurmdbd: it asked slurmdbd
    # (which answers only once its database does) and stops there.
    try:
        logs = SlurmTestbed.without_database(export, tmp_path / "run")
    except MissingSlurm as exc:
        pytest.fail(str(exc), pytrace=False)
    assert "mysql_real_connect failed" in logs["slurmdbd"] and DBD_NO_DATABASE in logs["slurmdbd"]
    assert CTLD_NO_DATABASE in logs["slurmctld"]
    assert re.search(r"persistent connection to host:127\.0\.0\.1:\d+", logs["slurmctld"])
    for log in logs.values():
        assert "Parsing error" not in log and "Can't find plugin" not in log, log

    # the controls: a bad key, or a file others may read, stops slurmdbd before that
    for edit, said in (
        (lambda p: p.write_text(p.read_text() + "StoragePassword=x\n"), "unrecognized key"),
        (lambda p: p.chmod(0o644), "should be 600 is 644"),
    ):
        broken = tmp_path / f"broken{len(said)}"
        shutil.copytree(export, broken)
        edit(broken / "slurmdbd.conf")
        with pytest.raises(SlurmTestbedError, match="slurmdbd exited") as refused:
            SlurmTestbed.without_database(broken, tmp_path / f"run{len(said)}")
        assert said in str(refused.value)


def test_exported_paths_are_those_debians_packages_make(make_cluster, tmp_path):
    """The export starts on a fresh Debian install as written: its state, spool and log
    directories are the ones the packages create, owned by slurm, and its pid files the
    ones the packages' systemd units watch."""
    c = make_cluster({"node01": 1})
    for accounting in ("file", "slurmdbd"):
        out = tmp_path / accounting
        proc = c.cli("export", "slurm", "--accounting", accounting, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        conf = _conf(out / "slurm.conf")
        dirs = [conf["StateSaveLocation"], conf["SlurmdSpoolDir"]]
        dirs += [str(Path(conf[k]).parent) for k in ("SlurmctldLogFile", "SlurmdLogFile")]
        pids = {"slurmctld": conf["SlurmctldPidFile"], "slurmd": conf["SlurmdPidFile"]}
        if accounting == "file":
            dirs.append(str(Path(conf["JobCompLoc"]).parent))
        else:
            dbd = _conf(out / "slurmdbd.conf")
            dirs.append(str(Path(dbd["LogFile"]).parent))
            pids["slurmdbd"] = dbd["PidFile"]
        for d in dirs:
            path = Path(d)
            assert path.is_dir(), f"{d} does not exist: not made by Debian's packages"
            assert pwd.getpwuid(path.stat().st_uid).pw_name == "slurm", d
        for daemon, pid_file in pids.items():
            unit = Path(f"/lib/systemd/system/{daemon}.service")
            assert unit.exists(), f"no {unit}: apt-get install {daemon}"
            assert f"PIDFile={pid_file}\n" in unit.read_text(), (daemon, pid_file)


SWEEP_TASK = (
    "import json, os, sys, time; time.sleep(0.5); print(json.dumps({'argv': sys.argv[1:],"
    " 'index': os.environ.get('GPUCLAIM_ARRAY_INDEX'), 'end': time.time()}))"
)
EVAL = "import json, os, time; print(json.dumps({'start': time.time()}))"
SWEEP_LINES = ["--lr 0.1 'a b'", '--lr 0.2 "$HOME"', "# a comment", "--lr 0.3 '*'"]
SWEEP_ARGS = [["--lr", "0.1", "a b"], ["--lr", "0.2", "$HOME"], ["--lr", "0.3", "*"]]


def test_an_exported_sweep_and_its_dependant_run_on_a_real_slurm(
    named_testbed, make_remote, slurm, tmp_path
):
    """`run --sweep` with at most 2 at once, then a job `--after` it, through gpuclaim;
    exported, SLURM runs the array (one task per line, each line's words exactly) and only
    then the dependant, chained by the exported submit-all.sh."""
    for alias, host in HOSTS.items():
        named_testbed.set_gpus(alias, [{"name": n, "memory_total_mib": 81920} for n in GPUS[host]])
    c = make_remote(named_testbed)
    work = tmp_path / "sweep work"
    work.mkdir()
    (work / "lrs.txt").write_text("\n".join(SWEEP_LINES) + "\n")
    c.ok(
        *("run", "--sweep", str(work / "lrs.txt"), "--max-running", "2", "--name", "lr"),
        *("--node", "node01", "-C", str(work), "--", "python3", "-c", SWEEP_TASK),
    )
    c.ok(
        *("run", "--after", "lr", "--name", "eval", "--node", "node01", "-C", str(work)),
        *("--", "python3", "-c", EVAL),
    )
    assert _wait_job(c, "eval", timeout=60)["state"] == "succeeded"

    export, scripts = tmp_path / "export", tmp_path / "scripts"
    assert c.cli("export", "slurm", "--out", str(export)).returncode == 0
    proc = c.cli("export", "sbatch", "--history", "1", "--out", str(scripts))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in scripts.iterdir()) == [
        "eval.sbatch",
        "lr.sbatch",
        "submit-all.sh",
    ]
    assert "#SBATCH --array=0-2%2" in (scripts / "lr.sbatch").read_text()

    tb = slurm(export, GPUS)
    (work / "logs").mkdir()
    out = tb.run("bash", str(scripts / "submit-all.sh"), cwd=scripts)
    assert out.strip() == "", out
    deadline = time.monotonic() + 60
    while tb.run("squeue", "-h").strip():
        assert time.monotonic() < deadline, tb.run("squeue")
        time.sleep(0.2)
    logs = {p.name: p.read_text() for p in (work / "logs").iterdir()}
    tasks = sorted((json.loads(t) for n, t in logs.items() if "_" in n), key=lambda t: t["index"])
    assert [t["index"] for t in tasks] == ["0", "1", "2"], logs
    assert [t["argv"] for t in tasks] == SWEEP_ARGS
    (eval_log,) = [json.loads(t) for n, t in logs.items() if "_" not in n]
    assert eval_log["start"] > max(t["end"] for t in tasks), "afterok: after the whole array"


def test_bookings_become_reservations_a_real_slurm_accepts(
    named_testbed, make_remote, slurm, tmp_path, monkeypatch
):
    """`reserve` through gpuclaim, then `export slurm`: reservations.sh makes a whole-node
    booking a SLURM reservation (accepted by a real slurmctld, with its node, user and UTC
    window), and writes a part-node one commented out, saying why."""
    for alias, host in HOSTS.items():
        named_testbed.set_gpus(alias, [{"name": n, "memory_total_mib": 81920} for n in GPUS[host]])
    c = make_remote(named_testbed)
    me = pwd.getpwuid(os.getuid()).pw_name  # SLURM wants a user it knows
    whole = c.json(
        "reserve",
        "-n",
        "2",
        "--node",
        "node01",
        "--start",
        "+1h",
        "--time",
        "2h",
        "--note",
        "paper deadline",
        user=me,
    )
    part = c.json("reserve", "--gpu", "node02:1", "--start", "+3h", "--time", "1h", user=me)
    export = tmp_path / "export"
    assert c.cli("export", "slurm", "--out", str(export)).returncode == 0
    script = (export / "reservations.sh").read_text()
    assert f"ReservationName=gpuclaim-{whole['id']} " in script
    assert f"\n# scontrol create reservation ReservationName=gpuclaim-{part['id']} " in script
    assert "reservations.sh" in (export / "MIGRATION.md").read_text()

    tb = slurm(export, GPUS)
    monkeypatch.setenv("TZ", "UTC")
    out = tb.run("bash", str(export / "reservations.sh"))
    assert "Reservation created" in out, out
    shown = tb.run("scontrol", "show", "reservation", "-o")
    (line,) = [ln for ln in shown.splitlines() if ln.strip()]
    fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
    assert fields["ReservationName"] == f"gpuclaim-{whole['id']}"
    assert fields["Nodes"] == "gpu01" and fields["Users"] == me
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(_epoch(whole["start"])))
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(_epoch(whole["end"])))
    assert (fields["StartTime"], fields["EndTime"]) == (start, end)


def _epoch(value: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
