"""`gpuclaim export slurm` / `export sbatch`: GPU type names, renderers pinned by golden files,
sbatch quoting of hostile values, the advice, the hardware probe, and the CLI.

The same files are run by a real SLURM in test_slurm_real.py. Golden files are rewritten with
GPUCLAIM_UPDATE_GOLDEN=1 (then read the diff before committing it).
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuclaim.app.slurm import (
    DB_PASSWORD_PLACEHOLDER,
    HISTORY,
    ExportOptions,
    GpuSlot,
    NodeSpec,
    autodetect_type,
    check_nodes,
    hostlist,
    job_gpu_type,
    jobs_since,
    partition_for,
    plan_partitions,
    queue_waits,
    render_cgroup_conf,
    render_gres_conf,
    render_migration_md,
    render_sbatch,
    render_slurm_conf,
    render_slurmdbd_conf,
    sbatch_quote,
    slurm_advice,
    slurm_signal,
    slurm_type_name,
    ssh_address,
)
from gpuclaim.core.errors import ConfigError, UsageError
from gpuclaim.core.model import ArrayRef, Job, JobRank
from gpuclaim.node.hardware import normalize_bus_id, parse_cpu_list, probe_hardware, real_memory
from gpuclaim.node.probe.smi_parse import parse_list_gpus, parse_query_gpu, parse_query_xml

GOLDEN = Path(__file__).parent / "golden" / "slurm"
FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
H100 = "NVIDIA H100 80GB HBM3"


# -- GPU type names ------------------------------------------------------------------------------

# Every model name in tests/fixtures/nvidia-smi/, and the type it must get. A new fixture with
# a new model fails test_every_fixture_model_has_a_type until it is added here.
FIXTURE_TYPES = {
    "NVIDIA H100 80GB HBM3": "h100",
    "NVIDIA H200": "h200",  # our own capture (fixture 12)
    "NVIDIA L40S": "l40s",
    "NVIDIA A100-SXM4-80GB": "a100",
    "NVIDIA RTX A5000": "rtx_a5000",
    "Tesla T4": "t4",
    "NVIDIA GeForce RTX 2080 SUPER": "rtx_2080_super",
    "": "",  # GB10 sample: the query had no name column; untyped is the safe answer
}

# Product names as NVML reports them, beyond the fixtures (SOURCES.md lists some).
CATALOGUE = {
    "NVIDIA B200": "b200",
    "NVIDIA GB200": "gb200",
    "NVIDIA H200 NVL": "h200",
    "NVIDIA GH200 480GB": "gh200",
    "NVIDIA H100 PCIe": "h100",
    "NVIDIA H100 NVL": "h100",
    "NVIDIA H800": "h800",
    "NVIDIA H20": "h20",
    "NVIDIA A100-PCIE-40GB": "a100",
    "NVIDIA A100 80GB PCIe": "a100",
    "NVIDIA A800 80GB PCIe": "a800",
    "NVIDIA A40": "a40",
    "NVIDIA A30": "a30",
    "NVIDIA A10": "a10",
    "NVIDIA A10G": "a10g",
    "NVIDIA A16": "a16",
    "NVIDIA A2": "a2",
    "NVIDIA L40": "l40",
    "NVIDIA L4": "l4",
    "Tesla V100-SXM2-32GB": "v100",
    "Tesla V100S-PCIE-32GB": "v100s",
    "Tesla P100-PCIE-16GB": "p100",
    "Tesla P40": "p40",
    "Tesla K80": "k80",
    "NVIDIA RTX A6000": "rtx_a6000",
    "NVIDIA RTX A4000": "rtx_a4000",
    "NVIDIA RTX 6000 Ada Generation": "rtx_6000_ada",
    "NVIDIA RTX 4000 SFF Ada Generation": "rtx_4000_sff_ada",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": "rtx_pro_6000",
    "Quadro RTX 6000": "quadro_rtx_6000",
    "Quadro RTX 8000": "quadro_rtx_8000",
    "Quadro GV100": "gv100",
    "NVIDIA GeForce RTX 5090": "rtx_5090",
    "NVIDIA GeForce RTX 4090": "rtx_4090",
    "NVIDIA GeForce RTX 4080 SUPER": "rtx_4080_super",
    "NVIDIA GeForce RTX 3090 Ti": "rtx_3090_ti",
    "NVIDIA GeForce RTX 3060": "rtx_3060",
    "NVIDIA GeForce RTX 2080 Ti": "rtx_2080_ti",
    "NVIDIA GeForce GTX 1080 Ti": "gtx_1080_ti",
    "NVIDIA GeForce GTX 1660 Ti": "gtx_1660_ti",
    "NVIDIA TITAN RTX": "titan_rtx",
    "NVIDIA TITAN V": "titan_v",
    "NVIDIA GB10": "gb10",
    # Unknown models: the name without vendor and memory/form factor, still a substring.
    "NVIDIA X900 96GB HBM4": "x900",
    "Graphics Device": "graphics_device",  # what early or unreleased boards report
    "NVIDIA Weird: GPU, #1": "",  # nothing usable: untyped
}


def _fixture_model_names() -> set[str]:
    """Every model name in the fixtures, read with the project's own parsers; compute-apps
    files name the GPU only in a column the parser does not keep, so csv reads it there."""
    names: set[str] = set()
    for path in sorted(p for p in FIXTURES.iterdir() if p.name[:2].isdigit()):
        text = path.read_text()
        if path.suffix == ".xml":
            names.update(g.name for g in parse_query_xml(text, "n")[0])
        elif "list-gpus" in path.name:
            names.update(name for _, name, _, _ in parse_list_gpus(text))
        elif "query-gpu" in path.name:
            names.update(g.name for g in parse_query_gpu(text, "n"))
        elif "compute-apps" in path.name:
            rows = list(csv.DictReader(text.splitlines(), skipinitialspace=True))
            names.update(r["gpu_name"] for r in rows if "gpu_name" in r)
        else:
            raise AssertionError(f"no parser for fixture {path.name}")
    return names


def test_every_fixture_model_has_a_type():
    assert _fixture_model_names() == set(FIXTURE_TYPES)


@pytest.mark.parametrize("name", sorted({**FIXTURE_TYPES, **CATALOGUE}))
def test_type_name_works_with_autodetect(name):
    expected = {**FIXTURE_TYPES, **CATALOGUE}[name]
    got = slurm_type_name(name)
    assert got == expected
    # AutoDetect=nvml accepts a configured type only as a substring of the detected one.
    assert got.lower() in autodetect_type(name)
    if got:  # usable in Gres=gpu:TYPE:N and as a partition name
        assert got[0].isalpha() and set(got) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.-")


def test_autodetect_type_is_slurms_rule():
    # gpu_common_underscorify_tolower: lowercase, spaces as underscores, nothing else.
    assert autodetect_type("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert autodetect_type("NVIDIA A100-SXM4-80GB") == "nvidia_a100-sxm4-80gb"
    assert autodetect_type("NVIDIA GeForce RTX 4090") == "nvidia_geforce_rtx_4090"
    assert "rtx4090" not in autodetect_type("NVIDIA GeForce RTX 4090")  # the classic mistake


# -- renderers, pinned by golden files -----------------------------------------------------------


def _node(name, gpus, cpus=224, host=None, mem=2_000_000, topo=(2, 56, 2), minors=None, addr=None):
    slots = tuple(
        GpuSlot(i, g, (minors or list(range(len(gpus))))[i], uuid=f"GPU-{name}-{i}")
        for i, g in enumerate(gpus)
    )
    return NodeSpec(name, host or name, cpus, *topo, mem, slots, addr)


def golden_inventory() -> list[NodeSpec]:
    return [
        _node("node01", [H100] * 8),
        _node("node02", [H100] * 8),
        _node("node03", [H100] * 8, mem=2_001_000),  # slightly different RAM: own line
        # mixed node, device minors not in index order (as in fixture 09)
        # an SSH alias that is not the hostname, reached at another name
        _node(
            "ws1",
            ["NVIDIA L40S", "NVIDIA L40S", "NVIDIA RTX A5000"],
            64,
            host="gpu-ws-1",
            mem=515_072,
            topo=(1, 32, 2),
            minors=[1, 0, 2],
            addr="ws1.lab.example.org",
        ),
        _node("localhost", ["Graphics Device"], 16, host="benchbox", mem=60_000, topo=(None,) * 3),
        _node("cpu01", [], 32, mem=128_000, topo=(2, 8, 2)),
    ]


GOLDEN_OPTS = ExportOptions(
    cluster="Lab",
    default_time_s=4 * 3600,
    max_time_s=7 * 86400,
    skipped=(("node04", "ssh: timed out"),),
)


def _job(**changes):
    base = Job(
        id="j-0123456789",
        name="bert-sweep",
        user="alice",
        argv=("python3", "train.py", "--lr", "3e-4", "--name", 'it\'s a "test"'),
        state="succeeded",
        submitted=1_700_000_000.0,
        time_limit_s=8 * 3600 + 1,
        gpus_per_node=2,
        workdir="/home/alice/bert sweep #3",
        env=(("CUDA_VISIBLE_DEVICES", "5"), ("HF_HOME", "/data/hf cache"), ("WANDB_MODE", "off")),
        ranks=(JobRank(0, "node01", (0, 1), ("GPU-node01-0", "GPU-node01-1")),),
    )
    return base.with_(**changes)


# `run --preemptible --requeue --preempt-signal USR2 -n 2 -- python3 train.py --resume`
SCAVENGER_JOB = _job(
    id="j-5ca5e5ca5e",
    name="scav",
    argv=("python3", "train.py", "--resume"),
    preemptible=True,
    requeue=True,
    preempt_signal="USR2",
    restarts=2,
    env=(("WANDB_MODE", "off"),),
)

TORCHRUN_ARGV = ("torchrun", "--nnodes", "2", "--nproc-per-node=2", "--max-restarts=3", "-m")
TORCHRUN_ARGV = (*TORCHRUN_ARGV, "pkg.train", "--x")


def golden_files() -> dict[str, str]:
    nodes = golden_inventory()
    gang = _job(name="ddp", nodes_wanted=2, argv=("python3", "-u", "train.py", "--epochs", "3"))
    torchrun = _job(
        name="ddp2",
        nodes_wanted=2,
        argv=TORCHRUN_ARGV,
    )
    shell_gang = _job(name="mpi", nodes_wanted=3, gpus_per_node=8, argv=("bash", "run.sh", "a b"))
    dbd = ExportOptions("Lab", accounting="slurmdbd", preempt_grace_s=90, kill_wait_s=20)
    return {
        "slurm.conf": render_slurm_conf(nodes, GOLDEN_OPTS),
        "slurmdbd/slurm.conf": render_slurm_conf(nodes, dbd),
        "slurmdbd/MIGRATION.md": render_migration_md(nodes, dbd),
        "gres.conf": render_gres_conf(nodes),
        "cgroup.conf": render_cgroup_conf(),
        "MIGRATION.md": render_migration_md(nodes, GOLDEN_OPTS),
        "scav.sbatch": render_sbatch(SCAVENGER_JOB, "h100", "h100", preempt_grace_s=45),
        "scav-ddp.sbatch": render_sbatch(
            SCAVENGER_JOB.with_(name="scav-ddp", nodes_wanted=2, requeue=False), "h100", "h100"
        ),
        "bert-sweep.sbatch": render_sbatch(_job(), "h100", "h100"),
        "ddp.sbatch": render_sbatch(gang, "h100", "h100"),
        "ddp2.sbatch": render_sbatch(torchrun, "h100", "h100"),
        "mpi.sbatch": render_sbatch(shell_gang.with_(workdir=None)),
    }


@pytest.mark.parametrize("name", sorted(golden_files()))
def test_golden(name):
    text = golden_files()[name]
    path = GOLDEN / name
    if os.environ.get("GPUCLAIM_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with GPUCLAIM_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_slurm_conf_compresses_identical_nodes_and_splits_partitions_by_type():
    conf = render_slurm_conf(golden_inventory(), GOLDEN_OPTS)
    node_lines = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    assert node_lines[0].startswith("NodeName=node[01-02] CPUs=224 Sockets=2 CoresPerSocket=56")
    assert "Gres=gpu:h100:8" in node_lines[0]
    assert node_lines[1].startswith("NodeName=node03 ")
    # named by its hostname, reached where gpuclaim reaches it
    ws = next(line for line in node_lines if line.startswith("NodeName=gpu-ws-1 "))
    assert "Gres=gpu:l40s:2,gpu:rtx_a5000:1" in ws and "NodeAddr=ws1.lab.example.org" in ws
    assert "NodeHostname" not in conf
    # "localhost" is gpuclaim's name for this machine; SLURM gets its hostname
    bench = next(line for line in node_lines if line.startswith("NodeName=benchbox "))
    assert "Sockets" not in bench and "Gres=gpu:graphics_device:1" in bench
    assert "# gpuclaim's names: ws1 is gpu-ws-1, localhost is benchbox." in conf
    parts = {p.name: p for p in plan_partitions(golden_inventory())}
    assert set(parts) == {"h100", "l40s", "rtx_a5000", "graphics_device", "cpu"}
    assert parts["h100"].default and parts["h100"].nodes == ("node01", "node02", "node03")
    assert parts["rtx_a5000"].nodes == ("gpu-ws-1",)
    assert parts["h100"].cpus_per_gpu == 28 and parts["rtx_a5000"].cpus_per_gpu == 21
    assert "# node04 is not here: it did not answer (ssh: timed out)." in conf
    for key in (
        "GresTypes=gpu",
        "SelectType=select/cons_tres",
        "SchedulerType=sched/backfill",
        "StateSaveLocation=/var/lib/slurm/slurmctld",  # Debian's packages make these
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
    ):
        assert key in conf
    gres = render_gres_conf(golden_inventory())
    assert "NodeName=node[01-03] Name=gpu Type=h100 File=/dev/nvidia[0-7]" in gres
    assert "NodeName=gpu-ws-1 Name=gpu Type=l40s File=/dev/nvidia[0-1]" in gres
    assert "NodeName=gpu-ws-1 Name=gpu Type=rtx_a5000 File=/dev/nvidia2" in gres


def _settings(text: str) -> dict[str, str]:
    return dict(
        line.split("=", 1)
        for line in text.splitlines()
        if "=" in line and not line.startswith(("#", "NodeName=", "PartitionName="))
    )


def test_default_accounting_needs_no_database():
    """What slurmctld 22.05 refuses or ignores without slurmdbd is not there (each measured:
    see test_slurm_real's BROKEN); a job-completion log keeps a record of every job."""
    conf = render_slurm_conf(golden_inventory(), GOLDEN_OPTS)
    settings = _settings(conf)
    assert settings["AccountingStorageType"] == "accounting_storage/none"
    assert settings["JobCompType"] == "jobcomp/filetxt"
    assert settings["JobCompLoc"] == "/var/log/slurm/jobcomp.log"
    assert settings["JobAcctGatherType"] == "jobacct_gather/cgroup"  # sstat
    assert settings["PriorityType"] == "priority/basic"
    for absent in ("AccountingStorageTRES", "AccountingStorageHost", "PriorityWeight"):
        assert f"\n{absent}" not in conf
    assert "TRESBillingWeights" not in conf
    assert HISTORY["file"].startswith("sacct -c ")  # job-completion data, not accounting


def test_slurmdbd_accounting_and_its_slurmdbd_conf_agree():
    opts = ExportOptions("Lab", accounting="slurmdbd", controller="ws1")
    conf = _settings(render_slurm_conf(golden_inventory(), opts))
    dbd_text = render_slurmdbd_conf(golden_inventory(), opts)
    dbd = _settings(dbd_text)
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    # slurmctld finds slurmdbd where slurmdbd runs, as the same user, on the same port
    assert conf["SlurmctldHost"] == "gpu-ws-1(ws1.lab.example.org)"
    assert dbd["DbdHost"] == "gpu-ws-1"  # `hostname -s` of its machine
    assert conf["AccountingStorageHost"] == "ws1.lab.example.org"
    assert conf["SlurmUser"] == dbd["SlurmUser"] == "slurm"
    assert conf["AuthType"] == dbd["AuthType"] == "auth/munge"
    assert "AccountingStoragePort" not in conf and "DbdPort" not in dbd  # both 6819
    assert conf["AccountingStorageTRES"].startswith("gres/gpu,gres/gpu:graphics_device,")
    assert conf["PriorityType"] == "priority/multifactor"
    assert conf["PriorityWeightFairshare"] == "1000"  # gpuclaim's [queue] defaults, the same
    assert conf["PriorityDecayHalfLife"] == "7-00:00:00" and conf["PriorityMaxAge"] == "1-00:00:00"
    custom = ExportOptions("Lab", accounting="slurmdbd", half_life_s=3 * 86400, age_weight=250)
    tuned = _settings(render_slurm_conf(golden_inventory(), custom))
    assert tuned["PriorityDecayHalfLife"] == "3-00:00:00" and tuned["PriorityWeightAge"] == "250"
    assert "JobCompType" not in conf
    text = render_slurm_conf(golden_inventory(), opts)
    # every GPU partition, the scavenger one too
    assert text.count('TRESBillingWeights="GRES/gpu=1.0"') == 5
    # a placeholder, never a password; the file says who may read it
    assert dbd["StorageType"] == "accounting_storage/mysql"
    assert dbd["StoragePass"] == DB_PASSWORD_PLACEHOLDER == "REPLACE_WITH_THE_DATABASE_PASSWORD"
    assert "install -o slurm -g slurm -m 0600 slurmdbd.conf /etc/slurm/" in dbd_text
    assert dbd["LogFile"] == "/var/log/slurm/slurmdbd.log"
    assert dbd["PidFile"] == "/run/slurmdbd.pid"


def test_an_unknown_accounting_is_refused():
    with pytest.raises(UsageError, match="no accounting 'sql'"):
        render_slurm_conf(golden_inventory(), ExportOptions("t", accounting="sql"))


def test_one_gpu_type_is_one_gpu_partition():
    nodes = [_node("a1", [H100] * 2), _node("a2", [H100] * 4)]
    (part,) = plan_partitions(nodes)
    assert (part.name, part.nodes, part.default, part.gpu_type) == (
        "gpu",
        ("a1", "a2"),
        True,
        "h100",
    )
    assert partition_for(nodes, "a2", "h100") == "gpu"


def test_nodes_are_named_by_the_hostname_they_report_and_reached_where_ssh_reaches_them():
    nodes = [
        _node("node01", [H100], host="dgx1", addr="10.1.0.11"),  # ssh_config HostName
        _node("node02", [H100], host="dgx2", addr="node02"),  # an alias DNS knows
        _node("dgx3", [H100], addr="dgx3"),  # alias and hostname are one: nothing to add
        _node("node04", [H100], host="dgx4", addr="127.0.0.1"),  # a tunnel
        _node("localhost", [H100], host="dgx5"),  # this machine: no SSH address
    ]
    conf = render_slurm_conf(nodes, ExportOptions("t"))
    lines = {line.split()[0]: line for line in conf.splitlines() if line.startswith("NodeName=")}
    assert "NodeAddr=10.1.0.11 " in lines["NodeName=dgx1"]
    assert "NodeAddr=node02 " in lines["NodeName=dgx2"]
    assert "NodeName=dgx[3-5]" in lines and "NodeAddr" not in lines["NodeName=dgx[3-5]"]
    assert "# gpuclaim reaches dgx4 at 127.0.0.1, a loopback address" in conf
    assert "SlurmctldHost=dgx1(10.1.0.11)" in conf  # the first node, at its address
    assert partition_for(nodes, "node04", "h100") == "gpu"
    assert plan_partitions(nodes)[0].nodes == ("dgx1", "dgx2", "dgx3", "dgx4", "dgx5")
    assert "NodeName=dgx[1-5] Name=gpu Type=h100 File=/dev/nvidia0" in render_gres_conf(nodes)


def test_two_nodes_reporting_one_hostname_are_refused_by_name():
    nodes = [
        _node("node01", [H100], host="vm"),
        _node("node02", [H100], host="VM"),  # hostnames do not care about case
        _node("node03", [H100], host="ws"),
        _node("node04", [H100], host="ws"),
        _node("node05", [H100]),
    ]
    with pytest.raises(ConfigError) as refused:
        render_slurm_conf(nodes, ExportOptions("t"))
    message = str(refused.value)
    assert message.startswith(
        "node01 and node02 report the same hostname, vm; node03 and node04 report the same "
        "hostname, ws: SLURM finds each node by its own hostname"
    )
    assert "\n" not in message
    for render in (render_gres_conf, render_migration_md):
        with pytest.raises(ConfigError):
            render(nodes, *([ExportOptions("t")] if render is render_migration_md else []))
    check_nodes(nodes[::2])  # one of each is fine


@pytest.mark.parametrize("hostname", ["", "localhost", "my host"])
def test_a_hostname_slurm_cannot_use_is_refused(hostname):
    with pytest.raises(ConfigError, match="node01 reports the hostname"):
        check_nodes([NodeSpec("node01", hostname, 8)])


def test_ssh_address_is_the_hostname_ssh_config_gives_the_alias(tmp_path, monkeypatch):
    from gpuclaim.core.config import parse_config

    monkeypatch.delenv("GPUCLAIM_SSH_CONFIG", raising=False)
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(
        "Host gpu1\n    HostName 10.1.0.11\n    Port 2222\n"
        "Host gpu*\n    User lab\nHost jumped\n    HostName dgx7.lab\n    ProxyJump gate\n"
    )
    config = parse_config(
        {
            "nodes": ["gpu1", "gpu2", "jumped", "other", "localhost"],
            "storage": str(tmp_path / "store"),
            "ssh_config": str(ssh_config),
            "node": {"other": {"host": "bob@10.9.9.9"}},
        }
    )
    got = {n.name: ssh_address(config, n) for n in config.nodes}
    assert got == {
        "gpu1": "10.1.0.11",
        "gpu2": "gpu2",
        "jumped": "dgx7.lab",
        "other": "10.9.9.9",
        "localhost": None,
    }


def test_hostlist():
    assert (
        hostlist(["node01", "node02", "node03", "node05", "gpu", "a1"]) == "a1,gpu,node[01-03,05]"
    )
    assert hostlist(["n9", "n10"]) == "n10,n9"  # different widths are different groups
    assert hostlist(["x"]) == "x"


def test_nothing_answered_is_an_error():
    from gpuclaim.core.errors import UsageError

    with pytest.raises(UsageError):
        render_slurm_conf([], ExportOptions("t"))


def _steps(migration: str) -> list[str]:
    """The administrator's numbered steps, each joined into one line."""
    section = migration.split("## For the administrator: switching over", 1)[1]
    steps: list[str] = []
    for line in section.splitlines():
        m = re.match(r"^(\d+)\. (.*)", line)
        if m:
            assert int(m.group(1)) == len(steps) + 1, "steps numbered 1, 2, 3..."
            steps.append(m.group(2))
        elif steps and line.startswith("   ") and line.strip():
            steps[-1] += " " + line.strip()
        elif steps and not line.strip():
            break
    return steps


def _step(steps: list[str], text: str) -> int:
    found = [i for i, s in enumerate(steps) if text in s]
    assert len(found) == 1, f"{text!r} in steps {found}"
    return found[0]


@pytest.mark.parametrize("accounting", ["file", "slurmdbd"])
def test_migration_drains_gpuclaim_before_any_slurmd_starts(accounting):
    opts = ExportOptions("Lab", accounting=accounting)
    steps = _steps(render_migration_md(golden_inventory(), opts))
    drain = _step(steps, "gpuclaim drain NODE")
    empty = _step(steps, "`gpuclaim status` shows no claimed GPU")
    start_ctld = _step(steps, "systemctl start slurmctld")
    start_slurmd = _step(steps, "systemctl enable --now slurmd")
    assert drain == 0  # first of all
    assert drain < empty < start_ctld <= start_slurmd
    # nothing before the start step can start slurmd, not even a node's reboot
    assert "systemctl disable slurmd" in steps[_step(steps, "apt-get install slurmd munge")]
    assert not any(re.search(r"start slurmd\b|slurmd -D", s) for s in steps[:start_slurmd])
    if accounting == "slurmdbd":
        dbd = _step(steps, "systemctl start slurmdbd")
        assert dbd < start_ctld
        assert DB_PASSWORD_PLACEHOLDER in steps[dbd] and "-m 0600 slurmdbd.conf" in steps[dbd]
        assert "mariadb-server" in steps[_step(steps, "On the controller")]
    else:
        assert not any("slurmdbd" in s or "mariadb" in s or "sacctmgr" in s for s in steps)


def test_migration_commands_are_never_split_across_lines():
    text = render_migration_md(golden_inventory(), ExportOptions("Lab", accounting="slurmdbd"))
    section = text.split("## For the administrator", 1)[1]
    for line in section.splitlines():
        assert line.count("`") % 2 == 0, line


@pytest.mark.parametrize("accounting", ["file", "slurmdbd"])
def test_migration_history_is_the_accounting_s_own(accounting):
    text = render_migration_md(golden_inventory(), ExportOptions("Lab", accounting=accounting))
    assert f"| `gpuclaim history` | `{HISTORY[accounting]}` |" in text
    assert ("fair share" in text.split("## What you type now")[0]) == (accounting == "slurmdbd")
    assert "SLURM calls each node by its hostname: ws1 is `gpu-ws-1`, localhost is" in text


# -- sbatch scripts ------------------------------------------------------------------------------

HOSTILE = [
    "it's",
    'say "hi"',
    "$HOME",
    "`id`",
    "$(touch /tmp/pwned)",
    "back\\slash",
    "#not a comment",
    "",
    "two\nlines",
    "*",
    "--flag=a b",
    "-",
    ";exit 1",
    "ünïcödé ✓",
    "\t",
]


def test_sbatch_command_arrives_byte_identical(tmp_path):
    """bash runs the exported script (the #SBATCH lines are comments to it): the program sees
    exactly the argv and environment the gpuclaim job had."""
    probe = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['HOSTILE']]))"
    job = _job(
        argv=(sys.executable, "-c", probe, *HOSTILE),
        env=(("HOSTILE", 'it\'s $HOME `id` "q"\n#'),),
        workdir=str(tmp_path),
        ranks=(),
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(job, "h100"))
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    argv, env = json.loads(proc.stdout)
    assert argv == HOSTILE
    assert env == 'it\'s $HOME `id` "q"\n#'
    assert not Path("/tmp/pwned").exists()


def _sbatch_argument(line: str) -> list[str]:
    """sbatch's _get_argument (src/sbatch/opt.c, 22.05): blanks split, quotes group, a
    backslash escapes anything, an unquoted # ends the line."""
    args, arg, quote, escape, i = [], None, "", False, 0
    while i <= len(line):
        ch = line[i] if i < len(line) else ""
        if ch == "" or (not quote and not escape and ch.isspace()):
            if arg is not None:
                args.append(arg)
            arg = None
            if ch == "":
                break
        elif escape:
            arg, escape = (arg or "") + ch, False
        elif ch == "\\":
            escape, arg = True, arg or ""
        elif quote:
            if ch == quote:
                quote = ""
            else:
                arg = (arg or "") + ch
        elif ch in "\"'":
            quote, arg = ch, arg or ""
        elif ch == "#":
            break
        else:
            arg = (arg or "") + ch
        i += 1
    return args


@pytest.mark.parametrize("value", [v for v in HOSTILE if "\n" not in v and v])
def test_sbatch_directive_values_survive_sbatchs_parser(value):
    assert _sbatch_argument(f" --chdir={sbatch_quote(value)}") == [f"--chdir={value}"]


def test_sbatch_refuses_what_an_sbatch_line_cannot_hold():
    from gpuclaim.core.errors import UsageError

    with pytest.raises(UsageError):
        render_sbatch(_job(workdir="/tmp/two\nlines"))


def test_sbatch_directives_come_before_any_command():
    # sbatch ignores #SBATCH lines after the first command, silently.
    for text in golden_files().values():
        if not text.startswith("#!"):
            continue
        lines = text.splitlines()
        first_command = next(i for i, line in enumerate(lines[1:], 1) if line and line[0] != "#")
        assert all(not line.startswith("#SBATCH") for line in lines[first_command:])


def test_sbatch_gang_uses_torch_distributed_run_with_c10d():
    text = golden_files()["ddp.sbatch"]
    assert "#SBATCH --nodes=2" in text and "#SBATCH --ntasks-per-node=1" in text
    assert "srun python3 -m torch.distributed.run" in text
    assert "--rdzv_backend=c10d" in text and '--rdzv_id="$SLURM_JOB_ID"' in text
    assert text.rstrip().endswith("train.py --epochs 3")
    torchrun = golden_files()["ddp2.sbatch"]
    # gpuclaim's --nnodes/--nproc-per-node give way to SLURM's; other options stay
    assert "--nnodes 2" not in torchrun and "--nproc-per-node=2" not in torchrun
    assert torchrun.rstrip().endswith("--max-restarts=3 -m pkg.train --x")
    shell = golden_files()["mpi.sbatch"]
    assert "srun bash -c 'NODE_RANK=$SLURM_NODEID exec \"$@\"' bash bash run.sh 'a b'" in shell
    assert "--chdir" not in shell and "#SBATCH --gres=gpu:8" in shell


# -- preemptible ("scavenger") jobs -----------------------------------------------------------


def _directives(script: str) -> list[str]:
    return [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_a_preemptible_requeue_job_asks_slurm_for_the_scavenger_partition_and_qos():
    script = golden_files()["scav.sbatch"]
    directives = _directives(script)
    assert "--partition=scavenger" in directives and "--partition=h100" not in directives
    assert "--qos=scavenger" in directives
    assert "--requeue" in directives and "--no-requeue" not in directives
    assert "--open-mode=append" in directives  # a requeued run keeps the earlier runs' output
    assert "--signal=USR2@0" in directives  # its own signal, and never before the time limit
    # SLURM signals job steps, not the batch shell: the command is one
    assert script.rstrip().endswith("\nsrun python3 train.py --resume")
    assert 'export GPUCLAIM_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"\n' in script
    assert "export GPUCLAIM_PREEMPT_GRACE=45\n" in script
    assert "(45s, gpuclaim's preempt_grace" in script


def test_a_plain_job_has_none_of_it():
    for name in ("bert-sweep.sbatch", "ddp.sbatch", "mpi.sbatch"):
        script = golden_files()[name]
        assert "scavenger" not in script and "requeue" not in script, name
        assert "--signal" not in script and "--open-mode" not in script, name
        assert "GPUCLAIM_PREEMPT" not in script and "Preemptible" not in script, name
    assert "\npython3 train.py --lr 3e-4 " in golden_files()["bert-sweep.sbatch"]  # no srun


def test_a_preemptible_job_without_requeue_ends_preempted():
    script = golden_files()["scav-ddp.sbatch"]
    directives = _directives(script)
    assert "--no-requeue" in directives and "--requeue" not in directives
    assert "--open-mode=append" not in directives
    assert "--qos=scavenger" in directives and "--signal=USR2@0" in directives
    assert "no-requeue: then it ends PREEMPTED" in script
    # a gang job: torch.distributed.run dies of USR2 (it handles TERM, INT, HUP, QUIT only)
    assert "srun python3 -m torch.distributed.run" in script
    assert "Caution: torch.distributed.run handles only SIGTERM" in script
    term = render_sbatch(SCAVENGER_JOB.with_(nodes_wanted=2, preempt_signal="TERM"), "h100")
    assert "--signal=TERM@0" in _directives(term) and "Caution" not in term


def test_an_array_of_preemptible_tasks_runs_each_under_srun():
    tasks = [
        SCAVENGER_JOB.with_(
            id=f"a-1r{i}",
            argv=("python3", "train.py", f"--seed={i}"),
            array=ArrayRef("a-1", "s", i, 3),
        )
        for i in range(3)
    ]
    script = render_sbatch(tasks[0], "h100", None, tasks)
    assert "--array=0-2" in _directives(script) and "--partition=scavenger" in _directives(script)
    assert 'srun python3 train.py "${words[@]}"' in script


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("USR1", "USR1"),
        ("SIGUSR2", "USR2"),
        ("TERM", "TERM"),
        ("HUP", "HUP"),
        ("QUIT", "QUIT"),
        ("INT", "INT"),
        ("ALRM", "ALRM"),
        ("URG", "URG"),
        ("CONT", "CONT"),
        ("WINCH", "28"),
    ],
)
def test_every_preempt_signal_is_one_sbatch_can_send(name, want):
    # sbatch knows these names (sig_name2num); WINCH only as its number
    assert slurm_signal(name) == want


def test_an_unknown_signal_is_refused():
    with pytest.raises(UsageError, match="SIGNOPE"):
        slurm_signal("NOPE")


def test_slurm_conf_preempts_scavengers_by_partition_without_slurmdbd():
    opts = ExportOptions("Lab", preempt_grace_s=45, kill_wait_s=12)
    text = render_slurm_conf(golden_inventory(), opts)
    conf = _settings(text)
    assert conf["PreemptType"] == "preempt/partition_prio"
    assert conf["PreemptMode"] == "REQUEUE"
    assert conf["JobRequeue"] == "0"  # requeued only with --requeue, as under gpuclaim
    assert conf["SlurmctldParameters"] == "preempt_send_user_signal"
    assert conf["KillWait"] == "12"
    (line,) = [x for x in text.splitlines() if x.startswith("PartitionName=scavenger ")]
    part = dict(w.split("=", 1) for w in line.split())
    assert part["Nodes"] == "benchbox,gpu-ws-1,node[01-03]"  # every GPU node, no cpu01
    assert part["PriorityTier"] == "0" and part["PreemptMode"] == "REQUEUE"
    assert part["GraceTime"] == "45" and part["Default"] == "NO"
    assert (part["DefCpuPerGPU"], part["DefMemPerGPU"]) == ("16", "60000")  # the smallest
    others = [x for x in text.splitlines() if x.startswith("PartitionName=") and x != line]
    assert others and all("PriorityTier" not in x and "GraceTime" not in x for x in others)


def test_slurm_conf_preempts_scavengers_by_qos_with_slurmdbd():
    opts = ExportOptions("Lab", accounting="slurmdbd", preempt_grace_s=45)
    text = render_slurm_conf(golden_inventory(), opts)
    conf = _settings(text)
    assert conf["PreemptType"] == "preempt/qos" and conf["PreemptMode"] == "REQUEUE"
    assert conf["JobRequeue"] == "0" and conf["KillWait"] == "30"
    (line,) = [x for x in text.splitlines() if x.startswith("PartitionName=scavenger ")]
    # under preempt/qos the QOS's GraceTime and PreemptMode count, a partition's do not
    assert "GraceTime" not in line and "PreemptMode" not in line and "PriorityTier=0" in line
    migration = render_migration_md(golden_inventory(), opts)
    steps = _steps(migration)
    qos = _step(steps, "sacctmgr add qos scavenger PreemptMode=requeue GraceTime=45 UsageFactor=0")
    assert qos == _step(steps, "sacctmgr modify qos normal set Preempt=scavenger")
    assert qos == _step(steps, "sacctmgr add account lab QOS=normal,scavenger DefaultQOS=normal")
    assert steps[qos].index("add qos") < steps[qos].index("add user NAME")
    assert qos < _step(steps, "systemctl start slurmctld")
    assert "UsageFactor=0 of the QOS" in migration


def test_no_gpu_no_preemption():
    text = render_slurm_conf([_node("cpu01", [], 32, mem=128_000)], ExportOptions("t"))
    assert "scavenger" not in text and "Preempt" not in text
    migration = render_migration_md([_node("cpu01", [], 32, mem=128_000)], ExportOptions("t"))
    assert "## Preemptible jobs" not in migration


@pytest.mark.parametrize("accounting", ["file", "slurmdbd"])
def test_migration_says_what_each_preemption_flag_becomes(accounting):
    opts = ExportOptions("Lab", accounting=accounting, preempt_grace_s=45, kill_wait_s=12)
    text = render_migration_md(golden_inventory(), opts)
    section = text.split("## Preemptible jobs\n", 1)[1].split("\n## ", 1)[0]
    rows = {r.split(" | ")[0].strip("| "): r for r in section.splitlines() if r.startswith("| `")}
    assert "--partition=scavenger --qos=scavenger" in rows["`run --preemptible`"]
    assert "`--requeue --open-mode=append`" in rows["`--requeue`"]
    assert "`--no-requeue`, ends PREEMPTED" in rows["`--requeue`"]
    assert "`--signal=USR1@0`" in rows["`--preempt-signal USR1`"]
    owner = "QOS" if accounting == "slurmdbd" else "partition"
    assert f"GraceTime=45 of the `scavenger` {owner}" in rows["`[queue] preempt_grace` (45s)"]
    assert "KillWait=12" in rows["`[limits] kill_grace`"]
    assert "| `run --preemptible --requeue` | `sbatch --partition=scavenger" in text


def test_cli_export_maps_the_cluster_s_preempt_grace(make_cluster, tmp_path):
    c = make_cluster({"node01": 2}, kill_grace="7s")
    c.config_path.write_text(c.config_path.read_text() + '\n[queue]\npreempt_grace = "45s"\n')
    c.ok(
        *("run", "--preemptible", "--requeue", "--preempt-signal", "USR2", "--name", "scav"),
        *("--", "python3", "-c", "pass"),
    )
    c.ok("run", "--name", "plain", "--", "true")
    out = tmp_path / "slurm"
    assert c.cli("export", "slurm", "--out", str(out)).returncode == 0
    conf = (out / "slurm.conf").read_text()
    assert re.search(r"^PartitionName=scavenger .* GraceTime=45 State=UP$", conf, re.MULTILINE)
    assert "\nKillWait=7\n" in conf
    proc = c.cli("export", "sbatch", "scav")
    assert proc.returncode == 0, proc.stderr
    directives = _directives(proc.stdout)
    assert {"--partition=scavenger", "--qos=scavenger", "--requeue", "--signal=USR2@0"} <= set(
        directives
    )
    assert "export GPUCLAIM_PREEMPT_GRACE=45\n" in proc.stdout
    plain = c.cli("export", "sbatch", "plain")
    assert plain.returncode == 0 and "scavenger" not in plain.stdout
    assert "requeue" not in plain.stdout


def test_jobs_since_keeps_the_newest_run_of_each_name():
    old = _job(id="j-1", submitted=100.0)
    rerun = _job(id="j-2", submitted=200.0)
    bob = _job(id="j-3", user="bob", submitted=300.0)
    ancient = _job(id="j-0", name="other", submitted=1.0)
    assert [j.id for j in jobs_since([ancient, old, rerun, bob], 50.0, "alice")] == ["j-2"]
    assert [j.id for j in jobs_since([ancient, old, rerun, bob], 50.0, None)] == ["j-2", "j-3"]


def test_job_gpu_type_is_the_type_of_the_gpus_it_ran_on():
    nodes = golden_inventory()
    ws = _job(ranks=(JobRank(0, "ws1", (2,), ("GPU-ws1-2",)),))
    assert job_gpu_type(nodes, ws) == "rtx_a5000"
    assert partition_for(nodes, "ws1", "rtx_a5000") == "rtx_a5000"
    assert job_gpu_type(nodes, _job()) == "h100"  # ran on node01
    queued = _job(ranks=(), state="queued")
    assert job_gpu_type(nodes, queued) == ""  # could run anywhere: any GPU
    assert job_gpu_type(nodes, queued.with_(node="node02")) == "h100"
    assert job_gpu_type(nodes, queued.with_(node="ws1")) == ""  # two types there


def test_interactive_jobs_have_no_batch_script():
    from gpuclaim.core.errors import UsageError

    with pytest.raises(UsageError, match="srun --gres=gpu:h100:2 --pty bash"):
        render_sbatch(_job(kind="shell"), "h100")


# -- advice --------------------------------------------------------------------------------------


def test_slurm_advice_thresholds():
    assert slurm_advice(16, 8) is None
    assert slurm_advice(16, 8, [7200, 7200, 100]) is None
    gpus = slurm_advice(17, 3)
    assert gpus is not None and "17 GPUs" in gpus and "gpuclaim export slurm" in gpus
    users = slurm_advice(4, 9)
    assert users is not None and "9 users" in users
    waits = slurm_advice(4, 2, [3600, 5000, 9000, 10])
    assert waits is not None and "3 jobs that waited over an hour" in waits


def test_queue_waits():
    now = 10_000.0
    jobs = [
        _job(submitted=1000.0, started=1100.0),
        _job(submitted=2000.0, state="queued"),
        _job(submitted=10.0, started=9000.0),  # before the window
        _job(submitted=3000.0, state="killed", started=None),  # left the queue unstarted
    ]
    assert queue_waits(jobs, since=500.0, now=now) == [100.0, 8000.0]


# -- the hardware probe --------------------------------------------------------------------------


def _fake_host(root: Path, packages_cores: list[tuple[int, int]], meminfo_kb: int) -> None:
    cpu_dir = root / "sys/devices/system/cpu"
    cpu_dir.mkdir(parents=True)
    (cpu_dir / "online").write_text(f"0-{len(packages_cores) - 1}\n")
    for i, (pkg, core) in enumerate(packages_cores):
        topo = cpu_dir / f"cpu{i}" / "topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{pkg}\n")
        (topo / "core_id").write_text(f"{core}\n")
    (root / "proc").mkdir()
    (root / "proc/meminfo").write_text(f"MemTotal:       {meminfo_kb} kB\nMemFree: 1 kB\n")


def test_probe_hardware_two_sockets_with_hyperthreads(tmp_path):
    # 2 sockets x 4 cores x 2 threads, numbered the way Linux does (siblings far apart)
    cpus = [(s, c) for _ in range(2) for s in range(2) for c in range(4)]
    _fake_host(tmp_path, cpus, 2_113_024_000)
    gpus = tmp_path / "proc/driver/nvidia/gpus"
    for bus, minor, uuid in (("0000:81:00.0", 1, "GPU-b"), ("0000:c1:00.0", 0, "GPU-a")):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(
            f"Model: \t\t NVIDIA RTX A5000\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n"
            f"Device Minor: \t {minor}\n"
        )
    hw = probe_hardware(str(tmp_path))
    assert (hw["cpus"], hw["sockets"], hw["cores_per_socket"], hw["threads_per_core"]) == (
        16,
        2,
        4,
        2,
    )
    assert hw["mem_total_mib"] == 2_063_500
    assert hw["real_memory_mib"] == 2_021_376 and hw["real_memory_mib"] % 1024 == 0
    assert hw["gpu_minors"] == {"0000:81:00.0": 1, "GPU-b": 1, "0000:c1:00.0": 0, "GPU-a": 0}
    assert normalize_bus_id("00000000:C1:00.0") == "0000:c1:00.0"


def test_probe_hardware_hybrid_cores_give_cpus_only(tmp_path):
    # 2 performance cores with 2 threads + 4 efficiency cores with 1: no single ThreadsPerCore
    _fake_host(
        tmp_path, [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 3), (0, 4), (0, 5)], 8_000_000
    )
    hw = probe_hardware(str(tmp_path))
    assert hw["cpus"] == 8 and hw["sockets"] is None and hw["threads_per_core"] is None


def test_probe_hardware_on_this_machine():
    hw = probe_hardware()
    assert hw["cpus"] == len(parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text()))
    if hw["sockets"] is not None:  # None on hybrid CPUs, where only CPUs= can be configured
        assert hw["sockets"] * hw["cores_per_socket"] * hw["threads_per_core"] == hw["cpus"]
    assert 0 < hw["real_memory_mib"] < hw["mem_total_mib"]


def test_real_memory_is_a_little_under_the_total():
    assert real_memory(24105) == 23552
    assert real_memory(2000) == 1960  # too small to round to GiB


def test_agent_answers_the_hardware_op():
    from gpuclaim.node.agent import handle

    answer = handle({"op": "hardware"})
    assert answer["result"]["cpus"] >= 1 and "gpu_minors" in answer["result"]


# -- the CLI on local nodes ----------------------------------------------------------------------


def test_cli_export_slurm_writes_the_four_files(make_cluster, tmp_path):
    from conftest import gpu

    host = probe_hardware()["hostname"]
    c = make_cluster({"node01": [gpu(), gpu(), gpu("NVIDIA L40S", 46068)]})
    out = tmp_path / "slurm"
    proc = c.cli("export", "slurm", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "MIGRATION.md",
        "cgroup.conf",
        "gres.conf",
        "slurm.conf",
    ]
    conf = (out / "slurm.conf").read_text()
    # the node is named by the hostname it reported, not by gpuclaim's name for it
    assert f"NodeName={host} " in conf and "Gres=gpu:h100:2,gpu:l40s:1" in conf
    assert f"# gpuclaim's names: node01 is {host}." in conf
    assert f"PartitionName=h100 Nodes={host} Default=YES" in conf
    assert "MaxTime=7-00:00:00" in conf and "partitions h100, l40s" in proc.stdout
    assert "AccountingStorageType=accounting_storage/none" in conf
    assert "JobCompType=jobcomp/filetxt" in conf


def test_cli_export_slurm_with_slurmdbd_writes_a_private_slurmdbd_conf(make_cluster, tmp_path):
    host = probe_hardware()["hostname"]
    c = make_cluster({"node01": 2})
    out = tmp_path / "slurm"
    out.mkdir()
    (out / "slurmdbd.conf").write_text("an older one\n")
    (out / "slurmdbd.conf").chmod(0o644)
    proc = c.cli("export", "slurm", "--accounting", "slurmdbd", "--controller", "node01")
    assert proc.returncode == 2 and "--out" in proc.stderr  # --out is required
    proc = c.cli(
        "export", "slurm", "--accounting", "slurmdbd", "--controller", "node01", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    assert "slurmdbd.conf" in proc.stdout and DB_PASSWORD_PLACEHOLDER in proc.stdout
    dbd = out / "slurmdbd.conf"
    assert dbd.stat().st_mode & 0o777 == 0o600  # it will hold the database password
    assert f"DbdHost={host}\n" in dbd.read_text()
    assert f"StoragePass={DB_PASSWORD_PLACEHOLDER}\n" in dbd.read_text()
    conf = (out / "slurm.conf").read_text()
    assert f"SlurmctldHost={host}\n" in conf and f"AccountingStorageHost={host}\n" in conf
    assert "TRESBillingWeights" in conf
    assert "systemctl start slurmdbd" in (out / "MIGRATION.md").read_text()


def test_cli_export_slurm_refuses_an_unknown_accounting(make_cluster, tmp_path):
    c = make_cluster({"node01": 1})
    proc = c.cli("export", "slurm", "--accounting", "mysql", "--out", str(tmp_path / "s"))
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "mysql" in proc.stderr
    assert not (tmp_path / "s").exists()


def test_cli_export_slurm_refuses_two_nodes_on_one_machine(make_cluster, tmp_path):
    # both nodes are this machine: they report one hostname, and SLURM could not tell them apart
    host = probe_hardware()["hostname"]
    c = make_cluster({"node01": 1, "node02": 1})
    proc = c.cli("export", "slurm", "--out", str(tmp_path / "s"))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"gpuclaim: error: node01 and node02 report the same hostname, {host}: SLURM finds each"
        " node by its own hostname (one machine listed under two names in the config?"
        " machines cloned without a new hostname?)"
    ]
    assert not (tmp_path / "s").exists()  # nothing written


def test_cli_export_slurm_leaves_out_a_node_that_cannot_be_asked(make_cluster, tmp_path):
    host = probe_hardware()["hostname"]
    c = make_cluster({"node01": 1, "node02": 1})
    text = c.config_path.read_text().replace("fake_nvidia_smi", "no_such_module", 1)
    c.config_path.write_text(text)  # node01's probe now fails
    proc = c.cli("export", "slurm", "--out", str(tmp_path / "s"))
    assert proc.returncode == 4, proc.stderr
    conf = (tmp_path / "s" / "slurm.conf").read_text()
    assert "# node01 is not here" in conf and f"NodeName={host} " in conf
    assert "node01 is not in slurm.conf" in proc.stderr


def test_cli_export_sbatch_needs_a_name_or_history(make_cluster):
    c = make_cluster({"node01": 1})
    assert c.cli("export", "sbatch").returncode == 2
    assert c.cli("export", "sbatch", "--history", "3").returncode == 2  # --out needed
    missing = c.cli("export", "sbatch", "nosuchjob")
    assert missing.returncode == 1 and "no job 'nosuchjob'" in missing.stderr
    none = c.cli("export", "sbatch", "--history", "3", "--out", str(c.root / "jobs"))
    assert none.returncode == 0 and "No jobs of yours in the last 3 days." in none.stdout


def test_shards_for_shares_in_the_config_and_a_share_jobs_script():
    """export slurm --shards 4: every GPU is also four shards; a --gpu-mem job's script asks
    for the shards that hold its part (a real slurmctld runs them: test_slurm_real)."""
    nodes = golden_inventory()
    conf = render_slurm_conf(nodes, ExportOptions("Lab", shards_per_gpu=4))
    assert "GresTypes=gpu,shard" in conf
    assert "Gres=gpu:h100:8,shard:h100:32" in conf
    assert "NodeName=cpu01 " in conf and "shard" not in conf.split("NodeName=cpu01 ")[1].split()[0]
    gres = render_gres_conf(nodes, 4)
    assert "NodeName=gpu-ws-1 Name=shard Type=l40s Count=8" in gres  # by hostname, per type
    assert "cpu01" not in gres
    assert "GresTypes=gpu\n" in render_slurm_conf(nodes, GOLDEN_OPTS)  # none unless asked
    rank = JobRank(0, "node01", (0,), ("GPU-a",), "c-1", "succeeded", 0, mem_mib=19074,
                   mem_total_mib=81559)  # fmt: skip
    job = Job(
        id="j-1", name="eval", user="alice", argv=("python", "eval.py"), state="succeeded",
        submitted=0.0, time_limit_s=3600, gpu_mem_mib=19074, ranks=(rank,),
    )  # fmt: skip
    script = render_sbatch(job, "h100", "h100", shards_per_gpu=4)
    assert "#SBATCH --gres=shard:1\n" in script  # 19074 of 81559 MiB: 0.23 of a GPU
    assert "1 of a GPU's 4 shards here" in script
    half = render_sbatch(
        Job(**{**job.__dict__, "gpu_share": 0.5, "gpu_mem_mib": 0}), shards_per_gpu=4
    )
    assert "#SBATCH --gres=shard:2\n" in half
    whole = render_sbatch(job, "h100", "h100")
    assert "#SBATCH --gres=gpu:h100:1\n" in whole and "here a whole GPU" in whole
