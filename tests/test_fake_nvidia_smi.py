"""The simulator's nvidia-smi, run as a real subprocess, read back with the real parsers."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuclaim.node.probe.smi_parse import (
    APP_QUERY_FIELDS,
    GPU_QUERY_FIELDS,
    attach_processes,
    looks_like_no_driver,
    parse_compute_apps,
    parse_driver_version,
    parse_list_gpus,
    parse_query_gpu,
)
from gpuclaim.sim import fake_nvidia_smi
from gpuclaim.sim.fake_nvidia_smi import sim_uuid

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(fake_nvidia_smi.__file__)
NOHEADER = "--format=csv,noheader,nounits"
GPU_QUERY = f"--query-gpu={','.join(GPU_QUERY_FIELDS)}"
APP_QUERY = f"--query-compute-apps={','.join(APP_QUERY_FIELDS)}"


@pytest.fixture
def node() -> str:
    """A node name no other test (or a leftover process) uses."""
    return f"simtest-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def state(tmp_path: Path, node: str) -> Path:
    path = tmp_path / "state.json"
    write_state(
        path,
        {
            "driver_version": "550.54.15",
            "nodes": {
                node: {
                    "gpus": [
                        {
                            "name": "NVIDIA H100 80GB HBM3",
                            "memory_total_mib": 81559,
                            "memory_used_mib": 0,
                            "utilization_pct": 0,
                            "processes": [
                                {"pid": 4242, "name": "python", "used_memory_mib": 20000}
                            ],
                        },
                        {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559},
                    ]
                },
                "broken": {"fail": True, "delay_ms": 300},
            },
        },
    )
    return path


def write_state(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data))


def smi(
    state: Path, node: str, *args: str, extra_env: Optional[dict[str, str]] = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUCLAIM_SIM_STATE": str(state), "GPUCLAIM_NODE": node}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpuclaim.sim.fake_nvidia_smi", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith("\n")
    return result.stdout


def start_job(state: Path, node: str, cvd: str, *argv: str, **env: str) -> subprocess.Popen[bytes]:
    """A "job" on ``node`` of the simulated cluster whose state is ``state``."""
    job_env = {"PATH": os.environ["PATH"], "GPUCLAIM_NODE": node, "CUDA_VISIBLE_DEVICES": cvd}
    return subprocess.Popen(
        list(argv) or ["sleep", "30"],
        env={**job_env, "GPUCLAIM_SIM_STATE": str(state), **env},
        start_new_session=True,
    )


def stop(job: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(job.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    job.wait(timeout=10)


def test_sim_uuid_is_deterministic_and_shaped_like_nvidia() -> None:
    assert sim_uuid("node01", 0) == sim_uuid("node01", 0)
    assert sim_uuid("node01", 0) != sim_uuid("node01", 1) != sim_uuid("node02", 1)
    assert parse_list_gpus(f"GPU 0: X (UUID: {sim_uuid('n', 0)})")[0][2] == sim_uuid("n", 0)
    assert [len(part) for part in sim_uuid("node01", 3).split("-")] == [3, 8, 4, 4, 4, 12]


def test_query_gpu_round_trips(state: Path, node: str) -> None:
    out = ok(smi(state, node, GPU_QUERY, NOHEADER))
    gpus = parse_query_gpu(out, node, GPU_QUERY_FIELDS)
    assert [(g.index, g.uuid, g.pci_bus_id) for g in gpus] == [
        (0, sim_uuid(node, 0), "00000000:01:00.0"),
        (1, sim_uuid(node, 1), "00000000:02:00.0"),
    ]
    assert [(g.memory_total_mib, g.memory_used_mib, g.utilization_pct) for g in gpus] == [
        (81559, 20000, 0),
        (81559, 0, 0),
    ]
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g.mig_mode for g in gpus} == {False}
    assert parse_driver_version(out, GPU_QUERY_FIELDS) == "550.54.15"
    with_units = ok(smi(state, node, GPU_QUERY, "--format=csv"))
    assert with_units.splitlines()[0].split(", ")[4:7] == [
        "memory.total [MiB]",
        "memory.used [MiB]",
        "utilization.gpu [%]",
    ]
    assert "81559 MiB, 20000 MiB, 0 %" in with_units
    assert parse_query_gpu(with_units, node) == gpus


def test_every_documented_field(state: Path, node: str) -> None:
    fields = (
        "index,uuid,name,pci.bus_id,memory.total,memory.used,memory.free,utilization.gpu,"
        "utilization.memory,temperature.gpu,power.draw,count,driver_version,mig.mode.current,"
        "timestamp"
    )
    header, first, _ = ok(smi(state, node, f"--query-gpu={fields}", "--format=csv")).splitlines()
    assert header.split(", ")[6] == "memory.free [MiB]"
    assert "power.draw [W]" in header and "temperature.gpu" in header.split(", ")
    cells = first.split(", ")
    assert cells[6] == "61559 MiB" and cells[10].endswith(" W") and cells[11] == "2"
    apps = "pid,process_name,gpu_uuid,gpu_bus_id,gpu_name,used_memory,used_gpu_memory"
    out = ok(smi(state, node, f"--query-compute-apps={apps}", "--format=csv"))
    assert out.splitlines() == [
        "pid, process_name, gpu_uuid, gpu_bus_id, gpu_name, used_gpu_memory [MiB], "
        "used_gpu_memory [MiB]",
        f"4242, python, {sim_uuid(node, 0)}, 00000000:01:00.0, NVIDIA H100 80GB HBM3, "
        "20000 MiB, 20000 MiB",
    ]


def test_list_and_id_filter(state: Path, node: str) -> None:
    listing = parse_list_gpus(ok(smi(state, node, "-L")))
    assert [(i, u) for i, _, u, _ in listing] == [(0, sim_uuid(node, 0)), (1, sim_uuid(node, 1))]
    out = ok(smi(state, node, "--query-gpu=index,uuid", NOHEADER, "-i", "1"))
    assert out == f"1, {sim_uuid(node, 1)}\n"
    out = ok(smi(state, node, "--query-gpu=index", NOHEADER, f"--id={sim_uuid(node, 0)}"))
    assert out == "0\n"
    missing = smi(state, node, "-L", "-i", "7")
    assert missing.returncode == 6 and looks_like_no_driver(missing.stdout)


def test_summary_table(state: Path, node: str) -> None:
    out = ok(smi(state, node))
    assert "550.54.15" in out and "NVIDIA H100 80GB HBM3" in out and "4242" in out


def test_live_leaf_process_appears_on_its_gpu(state: Path, node: str) -> None:
    job = start_job(state, node, "1")
    try:
        gpus = parse_query_gpu(ok(smi(state, node, GPU_QUERY, NOHEADER)), node, GPU_QUERY_FIELDS)
        procs = parse_compute_apps(ok(smi(state, node, APP_QUERY, NOHEADER)), APP_QUERY_FIELDS)
        gpus = attach_processes(gpus, procs)
        assert [(p.pid, p.name) for p in gpus[0].processes] == [(4242, "python")]
        ((live,),) = [g.processes for g in gpus[1:]]
        assert (live.pid, live.name, live.used_memory_mib) == (job.pid, "sleep", 1024)
        assert (gpus[1].memory_used_mib, gpus[1].utilization_pct) == (1024, 100)
        assert (gpus[0].memory_used_mib, gpus[0].utilization_pct) == (20000, 0)
    finally:
        stop(job)
    after = parse_compute_apps(ok(smi(state, node, APP_QUERY, NOHEADER)), APP_QUERY_FIELDS)
    assert [p.pid for p in after] == [4242]


def test_live_job_by_uuid_with_its_memory_and_no_double_count(state: Path, node: str) -> None:
    # A shell that waits for its child: only the leaf (sleep) is the job.
    job = start_job(
        state,
        node,
        sim_uuid(node, 0),
        "sh",
        "-c",
        "sleep 30; exit 0",
        GPUCLAIM_FAKE_MEM_MIB="3000",
        GPUCLAIM_FAKE_UTIL_PCT="42",
    )
    other = start_job(state, node + "-x", "0")  # another node's job is not ours
    try:
        deadline = time.monotonic() + 10
        while True:
            procs = parse_compute_apps(ok(smi(state, node, APP_QUERY, NOHEADER)), APP_QUERY_FIELDS)
            if any(p.name == "sleep" for p in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.05)  # the shell may not have forked sleep yet
        assert [(p.name, p.used_memory_mib) for p in procs] == [("python", 20000), ("sleep", 3000)]
        assert procs[1].pid != job.pid and procs[1].gpu_uuid == sim_uuid(node, 0)
        gpus = parse_query_gpu(ok(smi(state, node, GPU_QUERY, NOHEADER)), node, GPU_QUERY_FIELDS)
        assert (gpus[0].memory_used_mib, gpus[0].utilization_pct) == (23000, 42)
    finally:
        stop(job)
        stop(other)


def test_failing_node_exits_9_after_its_delay(state: Path) -> None:
    started = time.monotonic()
    result = smi(state, "broken", GPU_QUERY, NOHEADER)
    assert time.monotonic() - started >= 0.3
    assert result.returncode == 9
    assert looks_like_no_driver(result.stdout)
    assert result.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")


def test_unknown_node_and_missing_state_look_like_no_driver(state: Path, tmp_path: Path) -> None:
    for result in (
        smi(state, "no-such-node", "-L"),
        smi(tmp_path / "missing.json", "node01", "-L"),
    ):
        assert result.returncode == 9 and looks_like_no_driver(result.stdout)


def test_unknown_field_exits_2(state: Path, node: str) -> None:
    result = smi(state, node, "--query-gpu=index,bogus", "--format=csv")
    assert result.returncode == 2
    assert result.stdout == 'Field "bogus" is not a valid field to query.\n'
    result = smi(state, node, "--query-compute-apps=pid,bogus", "--format=csv")
    assert result.returncode == 2


def test_defaults_and_unified_memory(tmp_path: Path, node: str) -> None:
    path = tmp_path / "state.json"
    write_state(path, {"nodes": {node: {"gpus": [{}, {"memory_total_mib": None}]}}})
    out = ok(smi(path, node, GPU_QUERY, NOHEADER))
    gpus = parse_query_gpu(out, node, GPU_QUERY_FIELDS)
    assert (gpus[0].memory_total_mib, gpus[0].memory_used_mib) == (81559, 0)
    assert (gpus[1].memory_total_mib, gpus[1].memory_used_mib) == (None, None)
    assert parse_driver_version(out, GPU_QUERY_FIELDS)
    write_state(path, {"nodes": {node: {"gpus": 3}}})
    assert len(parse_list_gpus(ok(smi(path, node, "-L")))) == 3


def test_runs_standalone_as_nvidia_smi_on_path(state: Path, node: str, tmp_path: Path) -> None:
    # The fake's #! line needs a python3 on PATH, as on every real node.
    assert shutil.which("python3") is not None, "no python3 on PATH for the #! line"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    shutil.copyfile(SCRIPT, exe)
    shutil.copyfile(SCRIPT.with_name("fake_report.py"), bindir / "fake_report.py")
    exe.chmod(0o755)
    env = {
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "GPUCLAIM_SIM_STATE": str(state),
        "GPUCLAIM_NODE": node,
    }
    result = subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert [u for _, _, u, _ in parse_list_gpus(result.stdout)] == [
        sim_uuid(node, 0),
        sim_uuid(node, 1),
    ]


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _csv_view(state: Path, node: str) -> list[Any]:
    gpus = parse_query_gpu(ok(smi(state, node, GPU_QUERY, NOHEADER)), node, GPU_QUERY_FIELDS)
    procs = parse_compute_apps(ok(smi(state, node, APP_QUERY, NOHEADER)), APP_QUERY_FIELDS)
    return attach_processes(gpus, procs)


def _without_users(gpus: Any) -> list[Any]:

    return [g.replace(processes=tuple(p.replace(user=None) for p in g.processes)) for g in gpus]


def test_one_xml_query_says_what_the_two_csv_queries_say(state: Path, node: str) -> None:
    """The probe makes one ``-q -x`` call; the simulator's XML must agree with its CSV."""
    from gpuclaim.node.probe.smi import probe_nvidia_smi

    job = start_job(state, node, "1")
    try:
        wait_until(
            lambda: any(p.pid == job.pid for g in _csv_view(state, node) for p in g.processes)
        )
        env = {"GPUCLAIM_SIM_STATE": str(state), "GPUCLAIM_NODE": node}
        inv = probe_nvidia_smi(node, [sys.executable, str(SCRIPT)], env)
        assert (inv.source, inv.driver_version, inv.error) == ("nvidia-smi", "550.54.15", None)
        assert _without_users(inv.gpus) == _csv_view(state, node)
        assert [p.user for p in inv.gpus[1].processes] == [pwd.getpwuid(os.getuid()).pw_name]
    finally:
        stop(job)
    assert ok(smi(state, node, "-q", "-x")).startswith('<?xml version="1.0" ?>')
    assert smi(state, node, "-q").returncode == 2  # the text report is not simulated
    broken = smi(state, "broken", "-q", "-x")
    assert broken.returncode == 9 and looks_like_no_driver(broken.stdout)


def test_the_nvml_face_sees_the_same_gpus_and_jobs(
    state: Path, node: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """probe_nvml through the simulator's pynvml: same GPUs, processes and live jobs as
    nvidia-smi, NVML kept initialised across probes (a warm agent), a failed driver refused."""
    from gpuclaim.core.errors import ProbeError
    from gpuclaim.node.probe import nvml
    from gpuclaim.sim import fake_pynvml

    monkeypatch.setenv("GPUCLAIM_SIM_STATE", str(state))
    monkeypatch.setenv("GPUCLAIM_NODE", node)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.setitem(nvml._keep, "on", True)
    monkeypatch.setitem(nvml._keep, "ready", False)
    before = nvml.probe_nvml(node)
    assert (before.source, before.driver_version) == ("nvml", "550.54.15")
    assert fake_pynvml._state["init"] == 1
    job = start_job(state, node, "1")
    try:
        wait_until(
            lambda: any(p.pid == job.pid for g in _csv_view(state, node) for p in g.processes)
        )
        during = nvml.probe_nvml(node)  # no second nvmlInit, yet the new job is seen
        assert fake_pynvml._state["init"] == 1
        assert _without_users(during.gpus) == _csv_view(state, node)
        assert during.gpus[1].processes[0].name == "sleep"
    finally:
        stop(job)
    assert nvml.probe_nvml(node).gpus[1].processes == ()
    monkeypatch.setitem(nvml._keep, "ready", False)
    monkeypatch.setenv("GPUCLAIM_NODE", "broken")
    with pytest.raises(ProbeError, match="NVML cannot start: Driver Not Loaded"):
        nvml.probe_nvml("broken")
