"""The export, proven by a real SLURM: jobs run through gpuclaim on SSH testbed nodes, then
`gpuclaim export slurm` and `export sbatch` through the CLI, then slurmctld and one slurmd per
node (Debian's packages; tests/slurm_testbed.py) run those files and the exported scripts.

A machine without SLURM fails here with the packages to install: CI proves the export.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from slurm_testbed import MissingSlurm, SlurmTestbed, SlurmTestbedError

from gpuclaim.hardware import probe_hardware
from gpuclaim.slurm_export import (
    ExportOptions,
    GpuSlot,
    NodeSpec,
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
)

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100 80GB PCIe"
A10 = "NVIDIA A10"  # "a10" is a substring of every A100's name: slurmd must still tell them apart
GPUS = {"node01": [H100, H100], "node02": [H100, H100], "node03": [A100, A10]}

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

    def up(export_dir: Path, gpus: dict[str, list[str]]) -> SlurmTestbed:
        root = tmp_path / f"slurm{len(started)}"
        root.mkdir()
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


def _wait_job(c, name, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        job = next(j for j in c.json("jobs", "--all") if j["name"] == name)
        if job["state"] not in ("queued", "starting", "running"):
            return job
        assert time.monotonic() < deadline, f"{name} still {job['state']}"
        time.sleep(0.3)


def test_exported_config_and_scripts_run_on_a_real_slurm(testbed, make_remote, slurm, tmp_path):
    t0 = time.monotonic()
    for node, names in GPUS.items():
        testbed.set_gpus(node, [{"name": n, "memory_total_mib": 81920} for n in names])
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
    assert re.search(r"^NodeName=node\[01-02\] .*Gres=gpu:h100:2 ", conf, re.MULTILINE)
    assert re.search(r"^NodeName=node03 .*Gres=gpu:a100:1,gpu:a10:1 ", conf, re.MULTILINE)
    t_export = time.monotonic()

    # SLURM runs the exported files: every node idle with its Gres, every GPU matched.
    tb = slurm(export, GPUS)
    t_up = time.monotonic()
    parts = tb.run("sinfo", "-h", "-o", "%P %D %G")
    assert parts.split()[0] == "h100*"

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
    assert [x["node"] for x in launchers] == ["node01", "node02"]
    for x in launchers:
        assert x["cvd"] == "0,1"
        assert x["launcher"][:2] == ["--nnodes=2", "--nproc_per_node=2"]
        assert x["launcher"][2:4] == [f"--rdzv_id={gang_id}", "--rdzv_backend=c10d"]
        assert re.fullmatch(r"--rdzv_endpoint=127\.0\.0\.1:\d+", x["launcher"][4])
    assert [x["script_args"] for x in lines if "script_args" in x] == [["--lr", "0.1", "a b"]] * 2
    t_end = time.monotonic()
    print(
        f"timings: gpuclaim jobs {t_jobs - t0:.1f}s, export {t_export - t_jobs:.1f}s, "
        f"SLURM up {t_up - t_export:.1f}s, two sbatch jobs {t_end - t_up:.1f}s"
    )


def _this_machine_export(tmp_path: Path) -> Path:
    """The export for GPUS on this machine's real hardware, rendered directly (fast)."""
    hw = probe_hardware()
    nodes = [
        NodeSpec(
            name,
            hw["hostname"],
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
    (out / "slurm.conf").write_text(render_slurm_conf(nodes, ExportOptions("testbed")))
    (out / "gres.conf").write_text(render_gres_conf(nodes))
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
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_export_is_refused(case, slurm, tmp_path):
    export = _this_machine_export(tmp_path)
    for name, old, new in BROKEN[case]:
        _break(export / name, old, new)
    with pytest.raises(SlurmTestbedError):
        slurm(export, GPUS)


def test_the_unbroken_export_of_this_machine_comes_up(slurm, tmp_path):
    # the control for the cases above: the same files, unbroken, are accepted
    tb = slurm(_this_machine_export(tmp_path), GPUS)
    assert "idle" in tb.run("sinfo", "-h", "-o", "%T")


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
