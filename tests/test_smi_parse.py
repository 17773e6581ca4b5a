"""The nvidia-smi parsers against real captured output (tests/fixtures/nvidia-smi/SOURCES.md)."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from gpuclaim.core.model import Gpu, GpuProcess
from gpuclaim.node.probe.smi_parse import (
    APP_QUERY_FIELDS,
    GPU_QUERY_FIELDS,
    attach_mig_devices,
    attach_processes,
    looks_like_no_driver,
    parse_compute_apps,
    parse_driver_version,
    parse_list_gpus,
    parse_query_gpu,
    parse_query_xml,
)

FIXTURES = Path(__file__).parent / "fixtures" / "nvidia-smi"
SAMPLES = sorted(p for p in FIXTURES.iterdir() if p.name[:2].isdigit())
ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"
NODE = "gpu-node"


def fixture(prefix: str) -> Path:
    (path,) = [p for p in SAMPLES if p.name.startswith(prefix + "_")]
    return path


def text(prefix: str) -> str:
    return fixture(prefix).read_text()


def parse_sample(path: Path) -> dict[str, Any]:
    """Parse a fixture with the parser its file name calls for (see SOURCES.md)."""
    body = path.read_text()
    if path.suffix == ".xml":
        gpus, driver = parse_query_xml(body, NODE)
        return {"gpus": gpus, "driver": driver}
    if "compute-apps" in path.name:
        return {"procs": parse_compute_apps(body)}
    if "list-gpus" in path.name:
        return {"listing": parse_list_gpus(body)}
    if "query-gpu" in path.name:
        return {"gpus": parse_query_gpu(body, NODE), "driver": parse_driver_version(body)}
    raise AssertionError(f"no parser known for fixture {path.name}: name it like the others")


def check_01(r: dict[str, Any]) -> None:
    (g,) = r["gpus"]
    assert g == Gpu(
        node=NODE,
        index=0,
        uuid=ZERO_UUID,
        name="NVIDIA H100 80GB HBM3",
        memory_total_mib=81559,
        memory_used_mib=19818,
        utilization_pct=100,
        pci_bus_id="00000000:00:09.0",
        mig_mode=False,
    )
    assert r["driver"] == "590.48.01"


def check_02(r: dict[str, Any]) -> None:
    procs = r["procs"]
    assert [(p.pid, p.name, p.used_memory_mib) for p in procs] == [
        (11327, "/root/tools/memhog", 2566),
        (11328, "/root/tools/memhog", 1542),
        (11345, "./gpu_burn", 15690),
    ]
    assert {p.gpu_uuid for p in procs} == {ZERO_UUID}
    assert {p.kind for p in procs} == {"C"}


def check_03(r: dict[str, Any]) -> None:
    (g,) = r["gpus"]
    assert g.mig_mode is True
    assert g.utilization_pct is None
    assert (g.memory_total_mib, g.memory_used_mib) == (81559, 11125)
    assert g.uuid == ZERO_UUID
    assert r["driver"] == "590.48.01"


def check_04(r: dict[str, Any]) -> None:
    procs = r["procs"]
    assert [(p.pid, p.used_memory_mib) for p in procs] == [
        (21180, 2296),
        (21181, 1272),
        (21198, 7484),
    ]
    # MIG: processes carry the parent GPU's UUID, so they attach to the parent from 03.
    assert {p.gpu_uuid for p in procs} == {ZERO_UUID}
    (parent,) = attach_processes(parse_query_gpu(text("03"), NODE), procs)
    assert [p.pid for p in parent.processes] == [21180, 21181, 21198]


def check_05(r: dict[str, Any]) -> None:
    ((index, name, uuid, migs),) = r["listing"]
    assert (index, name, uuid) == (0, "NVIDIA H100 80GB HBM3", ZERO_UUID)
    assert migs == [f"MIG-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(4)]
    (gpu,) = attach_mig_devices(parse_query_gpu(text("03"), NODE), r["listing"])
    assert gpu.mig_devices == tuple(migs)


def check_06(r: dict[str, Any]) -> None:
    procs = r["procs"]
    assert len(procs) == 21
    assert all(p.used_memory_mib is None for p in procs)  # WDDM: [N/A]
    by_pid = {p.pid: p.name for p in procs}
    assert by_pid[2140] == r"C:\Windows\System32\dwm.exe"
    assert by_pid[17648] == r"C:\Program Files\NVIDIA Corporation\NVIDIA App\CEF\NVIDIA Overlay.exe"
    assert by_pid[17840].startswith(r"C:\Program Files (x86)\Microsoft\EdgeWebView\Application")


def check_07(r: dict[str, Any]) -> None:
    (g,) = r["gpus"]
    assert (g.name, g.memory_total_mib, g.memory_used_mib, g.utilization_pct) == (
        "NVIDIA L40S",
        46068,
        1235,
        9,
    )
    assert g.mig_mode is None  # [N/A]: no MIG on this SKU
    assert g.pci_bus_id == "00000000:01:00.0"
    assert r["driver"] == "595.80"


def check_08(r: dict[str, Any]) -> None:
    (g,) = r["gpus"]  # the file says attached_gpus 4 but holds one <gpu>
    assert g.index == 0  # its minor_number is 1: not the index
    assert (g.uuid, g.name) == ("GPU-513536b6-7d19-9063-b049-1e69664bb298", "NVIDIA A100-SXM4-80GB")
    assert (g.memory_total_mib, g.memory_used_mib, g.utilization_pct) == (81920, 50, None)
    assert g.mig_mode is True
    assert g.mig_devices == ("GI 3/CI 0", "GI 4/CI 0", "GI 5/CI 0", "GI 6/CI 0")
    assert g.processes == ()
    assert r["driver"] == "535.54.03"


def check_09(r: dict[str, Any]) -> None:
    a, b = r["gpus"]
    # Index follows file (PCI) order although minor_number is 1 for bus 81 and 0 for bus C1.
    assert (a.index, a.pci_bus_id, a.uuid) == (
        0,
        "00000000:81:00.0",
        "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
    )
    assert (b.index, b.pci_bus_id, b.uuid) == (
        1,
        "00000000:C1:00.0",
        "GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
    )
    assert (a.memory_used_mib, b.memory_used_mib, a.utilization_pct) == (22437, 17253, 0)
    ((pa,), (pb,)) = a.processes, b.processes
    assert pa.pid == pb.pid == 100477
    assert (pa.used_memory_mib, pb.used_memory_mib) == (22430, 17246)
    assert (pa.gpu_uuid, pb.gpu_uuid) == (a.uuid, b.uuid)
    assert pa.name == "/root/src/llama.cpp/build/bin/llama-server"
    assert r["driver"] == "590.44.01"


def check_10(r: dict[str, Any]) -> None:
    (g,) = r["gpus"]
    assert (g.name, g.pci_bus_id, g.memory_total_mib, g.memory_used_mib) == (
        "Tesla T4",
        "00000000:00:1E.0",
        15360,
        1032,
    )
    assert [(p.pid, p.kind, p.name, p.used_memory_mib) for p in g.processes] == [
        (675, "G", "/usr/lib/xorg/Xorg", 22),
        (5762, "C", "python", 1005),
    ]
    assert r["driver"] == "515.105.01"


def check_11(r: dict[str, Any]) -> None:
    (g,) = r["gpus"]
    assert (g.memory_total_mib, g.memory_used_mib, g.utilization_pct) == (None, None, 0)
    assert (g.index, g.uuid, g.name) == (0, "", "")  # no such columns: unusable for claims
    assert r["driver"] is None


H200_UUID = "GPU-1adb0499-40e8-665f-2120-02715a8c4436"


def check_12(r: dict[str, Any]) -> None:
    """Our own capture (device run, session 28): driver 580.x, DTD v13, one idle H200. Its
    BAR1 (262144 MiB) and conf-compute (0 MiB) memory blocks come after fb_memory_usage and
    must not be taken for it."""
    (g,) = r["gpus"]
    assert (g.index, g.uuid, g.name, g.pci_bus_id) == (
        0,
        H200_UUID,
        "NVIDIA H200",
        "00000000:00:06.0",
    )
    assert (g.memory_total_mib, g.memory_used_mib, g.utilization_pct) == (143771, 0, 0)
    assert (g.mig_mode, g.mig_devices, g.processes) == (False, (), ())
    assert r["driver"] == "580.159.04"


def check_13(r: dict[str, Any]) -> None:
    assert r["listing"] == [(0, "NVIDIA H200", H200_UUID, [])]


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    name[len("check_") :]: fn for name, fn in globals().items() if name.startswith("check_")
}


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name[:2] for p in SAMPLES])
def test_fixture(path: Path) -> None:
    result = parse_sample(path)
    for gpu in result.get("gpus", ()):
        assert gpu.uuid == "" or re.fullmatch(r"GPU-[0-9a-f-]{36}", gpu.uuid)
        if gpu.memory_used_mib is not None and gpu.memory_total_mib is not None:
            assert 0 <= gpu.memory_used_mib <= gpu.memory_total_mib
        assert Gpu.from_dict(gpu.to_dict()) == gpu
    for proc in result.get("procs", ()):
        assert proc.pid > 0 and proc.name
        assert GpuProcess.from_dict(proc.to_dict()) == proc
    check = CHECKS.get(path.name[:2])
    if check is not None:
        check(result)


def test_every_check_has_its_fixture() -> None:
    assert sorted(CHECKS) == sorted({p.name[:2] for p in SAMPLES} & set(CHECKS))
    assert len(CHECKS) == 13


# --- the shapes gpuclaim itself asks for: noheader,nounits with a known field list -----


def _table(prefix: str) -> dict[str, str]:
    """Header name (units stripped) -> raw value, from a one-row fixture."""
    header, row = list(csv.reader(text(prefix).splitlines(), skipinitialspace=True))[:2]
    return {re.sub(r" \[.*\]$", "", h): v for h, v in zip(header, row)}


def _nounits(value: str) -> str:
    return re.sub(r" (MiB|%|W)$", "", value)


def test_query_gpu_noheader_nounits_from_real_values() -> None:
    table = _table("01")
    line = ", ".join(_nounits(table[f]) for f in GPU_QUERY_FIELDS)
    second = line.replace(ZERO_UUID, "GPU-00000001-0000-0000-0000-000000000001").replace(
        "0, GPU", "1, GPU", 1
    )
    assert line.startswith("0, GPU-")
    body = f"{line}\n{second}\n"
    gpus = parse_query_gpu(body, NODE, GPU_QUERY_FIELDS)
    assert gpus[0] == parse_query_gpu(text("01"), NODE)[0]
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[1].uuid == "GPU-00000001-0000-0000-0000-000000000001"
    assert parse_driver_version(body, GPU_QUERY_FIELDS) == "590.48.01"


def test_query_gpu_header_without_units_and_any_column_order() -> None:
    table = _table("03")
    names = list(reversed(list(table)))
    body = ", ".join(names) + "\n" + ", ".join(_nounits(table[n]) for n in names) + "\n"
    assert parse_query_gpu(body, NODE) == parse_query_gpu(text("03"), NODE)


def test_compute_apps_noheader_nounits_from_real_values() -> None:
    rows = list(csv.reader(text("02").splitlines(), skipinitialspace=True))
    header = [re.sub(r" \[.*\]$", "", h) for h in rows[0]]
    lines = [
        ", ".join(_nounits(dict(zip(header, r))[f]) for f in APP_QUERY_FIELDS) for r in rows[1:]
    ]
    procs = parse_compute_apps("\n".join(lines) + "\n", APP_QUERY_FIELDS)
    assert procs == parse_compute_apps(text("02"))


def test_compute_apps_aliases_and_commas_in_names() -> None:
    body = "GPU-a, 12, /opt/my,odd name, 5\n7, /bin/x\n"
    with pytest.raises(ValueError):
        parse_compute_apps(body, ("gpu_uuid", "pid", "name", "used_memory"))
    procs = parse_compute_apps(body.splitlines()[0], ("gpu_uuid", "pid", "name", "used_memory"))
    assert procs == [
        GpuProcess(pid=12, name="/opt/my, odd name", used_memory_mib=5, gpu_uuid="GPU-a")
    ]


def test_attach_processes_by_uuid_only() -> None:
    gpus = [Gpu(NODE, 0, "GPU-a", "x"), Gpu(NODE, 1, "GPU-b", "x"), Gpu(NODE, 2, "", "x")]
    procs = [
        GpuProcess(1, "p1", gpu_uuid="GPU-b"),
        GpuProcess(2, "p2", gpu_uuid="GPU-a"),
        GpuProcess(3, "p3", gpu_uuid=None),
        GpuProcess(4, "p4", gpu_uuid="GPU-b"),
    ]
    out = attach_processes(gpus, procs)
    assert [[p.pid for p in g.processes] for g in out] == [[2], [1, 4], []]


def test_blank_output_means_nothing() -> None:
    assert parse_query_gpu("", NODE) == []
    assert parse_query_gpu("\n", NODE, GPU_QUERY_FIELDS) == []
    assert parse_compute_apps("") == []
    assert parse_compute_apps(text("02").splitlines()[0] + "\n") == []  # header only
    assert parse_list_gpus("") == []


GARBAGE: list[tuple[str, Callable[[], object]]] = [
    ("prose", lambda: parse_query_gpu("hello world\nthis is not csv\n", NODE)),
    ("no-devices", lambda: parse_query_gpu("No devices were found\n", NODE)),
    ("noheader-without-fields", lambda: parse_query_gpu("0, GPU-x, NVIDIA H100\n", NODE)),
    ("short-row", lambda: parse_query_gpu("0, GPU-x\n", NODE, GPU_QUERY_FIELDS)),
    ("bad-number", lambda: parse_query_gpu("index, memory.used [MiB]\n0, lots MiB\n", NODE)),
    ("bad-unit", lambda: parse_query_gpu("memory.used\n12 GHz\n", NODE)),
    ("apps-prose", lambda: parse_compute_apps("Segmentation fault\n")),
    ("apps-no-pid", lambda: parse_compute_apps("gpu_uuid, process_name\nGPU-x, python\n")),
    ("apps-bad-pid", lambda: parse_compute_apps("x, abc, python, 1\n", APP_QUERY_FIELDS)),
    ("list-prose", lambda: parse_list_gpus("NVIDIA-SMI has failed because ...\n")),
    ("list-orphan-mig", lambda: parse_list_gpus("  MIG 1g.10gb Device 0: (UUID: MIG-x)\n")),
    ("xml-broken", lambda: parse_query_xml("<nvidia_smi_log><gpu>", NODE)),
    ("xml-other", lambda: parse_query_xml("<html><body/></html>", NODE)),
    ("xml-text", lambda: parse_query_xml(text("01"), NODE)),
    ("xml-bad-pid", lambda: parse_query_xml(text("10").replace("<pid>675", "<pid>x"), NODE)),
]


@pytest.mark.parametrize("call", [c for _, c in GARBAGE], ids=[n for n, _ in GARBAGE])
def test_garbage_raises_value_error(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        call()


def test_looks_like_no_driver() -> None:
    assert looks_like_no_driver(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running.\n"
    )
    assert looks_like_no_driver("No devices were found\n")
    assert looks_like_no_driver("Failed to initialize NVML: Driver/library version mismatch\n")
    assert not looks_like_no_driver("")
    assert not any(looks_like_no_driver(p.read_text()) for p in SAMPLES)


def test_probe_nvml_without_a_driver_is_a_probe_error() -> None:
    """On a GPU-less machine NVML cannot start; on a GPU node the probe must succeed."""
    from gpuclaim.core.errors import ProbeError
    from gpuclaim.node.probe.nvml import probe_nvml

    try:
        inventory = probe_nvml(NODE)
    except ProbeError as exc:
        assert str(exc)
        return
    assert inventory.source == "nvml" and inventory.node == NODE
    assert all(g.uuid.startswith("GPU-") for g in inventory.gpus)
