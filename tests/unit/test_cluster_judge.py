"""How a probed GPU is judged (engine/cluster.py): free, claimed, busy-unclaimed, stale or
reserved. The GPUs come from real nvidia-smi answers (tests/fixtures/nvidia-smi) through the
real parsers; the claims from a temporary store."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpuclaim.core.booking import Booking
from gpuclaim.core.config import Limits, parse_config
from gpuclaim.core.model import ClaimedGpu, Gpu, NodeInventory
from gpuclaim.engine.cluster import build_view, judge_gpu, with_booking
from gpuclaim.node.probe.smi_parse import (
    attach_processes,
    parse_compute_apps,
    parse_query_gpu,
    parse_query_xml,
)
from gpuclaim.store import ClaimFile, Snapshot
from tests.unit.job_factory import hold, new_store

SMI = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"
NODE = "gpu01"


def _xml(name: str) -> list[Gpu]:
    return parse_query_xml((SMI / name).read_text(), NODE)[0]


def _csv(gpus: str, apps: str | None = None) -> Gpu:
    [gpu] = parse_query_gpu((SMI / gpus).read_text(), NODE)
    if apps is None:
        return gpu
    [with_procs] = attach_processes([gpu], parse_compute_apps((SMI / apps).read_text()))
    return with_procs


A5000 = "09_2x-rtx-a5000_drv590.44.01_q-x_v13_procs.xml"  # llama-server on both GPUs
T4 = "10_tesla-t4_drv515.105.01_q-x_v11_procs.xml"  # Xorg 22 MiB and python 1005 MiB
A100_MIG = "08_a100-sxm4-80gb-mig_drv535.54.03_q-x_v12.xml"  # 50 MiB used, no processes
H100 = "01_h100-80gb-hbm3_drv590.48.01_load_query-gpu_allfields.csv"
H100_APPS = "02_h100-80gb-hbm3_drv590.48.01_load_query-compute-apps.csv"
H100_MIG = "03_h100-mig_drv590.48.01_load_query-gpu_allfields.csv"  # 11125 MiB, no processes
WDDM_APPS = "06_win_rtx-2080-super_drv610.62_load_query-compute-apps_wddm.csv"  # no memory
GB10 = "11_dgx-spark-gb10_drv580.173.02_query-gpu_memory-NA.csv"  # memory [N/A]
EMPTY = Snapshot(now=1_000_000.0)


def _judge(gpu: Gpu, limits: Limits | None = None) -> tuple[str, str]:
    row = judge_gpu(gpu, None, EMPTY, limits or Limits())
    return row.state, row.reason


def test_a_model_server_without_a_claim_makes_both_gpus_busy() -> None:
    rows = [judge_gpu(g, None, EMPTY, Limits()) for g in _xml(A5000)]
    assert [r.state for r in rows] == ["busy-unclaimed", "busy-unclaimed"]
    assert rows[0].reason == "no claim: llama-server (pid 100477) 21.9 GiB"
    assert rows[1].reason == "no claim: llama-server (pid 100477) 16.8 GiB"
    assert [p.pid for p in rows[0].foreign] == [100477]


@pytest.mark.parametrize(
    "threshold, state", [(22430, "busy-unclaimed"), (22431, "free"), (256, "busy-unclaimed")]
)
def test_busy_from_the_threshold_of_foreign_memory_on(threshold: int, state: str) -> None:
    gpu = _xml(A5000)[0]  # llama-server holds 22430 MiB
    assert _judge(gpu, Limits(busy_memory_mib=threshold))[0] == state


def test_a_display_server_does_not_count_its_path_is_cut_to_the_name() -> None:
    [t4] = _xml(T4)
    row = judge_gpu(t4, None, EMPTY, Limits())
    assert row.state == "busy-unclaimed"
    assert [p.name for p in row.foreign] == ["python"]  # /usr/lib/xorg/Xorg is ignored
    assert row.reason == "no claim: python (pid 5762) 1.0 GiB"


def test_only_ignored_processes_leave_a_gpu_free_whatever_memory_they_hold() -> None:
    [t4] = _xml(T4)
    limits = Limits(ignore_processes=("Xorg", "python"), busy_memory_mib=1)
    assert _judge(t4, limits) == ("free", "")


def test_foreign_memory_under_the_threshold_is_free_but_still_listed() -> None:
    [t4] = _xml(T4)
    row = judge_gpu(t4, None, EMPTY, Limits(busy_memory_mib=2000))
    assert row.state == "free" and [p.pid for p in row.foreign] == [5762]


def test_nothing_ignored_counts_the_display_server_too() -> None:
    [t4] = _xml(T4)
    row = judge_gpu(t4, None, EMPTY, Limits(ignore_processes=(), busy_memory_mib=1020))
    assert row.state == "busy-unclaimed"  # 22 + 1005 MiB
    assert [p.pid for p in row.foreign] == [675, 5762]


def test_three_processes_are_named_in_the_reason() -> None:
    gpu = _csv(H100, H100_APPS)
    state, reason = _judge(gpu)
    assert state == "busy-unclaimed"
    assert reason == (
        "no claim: memhog (pid 11327) 2.5 GiB, memhog (pid 11328) 1.5 GiB, "
        "gpu_burn (pid 11345) 15.3 GiB"
    )


def test_processes_of_unknown_memory_make_it_busy_whatever_the_threshold() -> None:
    gpu = _csv(H100, WDDM_APPS)  # Windows (WDDM) does not say what a process holds
    assert len(gpu.processes) == 21
    state, reason = _judge(gpu, Limits(busy_memory_mib=10**9))
    assert state == "busy-unclaimed"
    assert reason == (
        "no claim: dwm.exe (pid 2140), ShellHost.exe (pid 13264), "
        "CrossDeviceResume.exe (pid 13504) and 18 more"
    )


def test_windows_paths_are_cut_to_the_name_for_ignore_processes() -> None:
    gpu = _csv(H100, WDDM_APPS)
    names = tuple({p.name.rsplit("\\", 1)[-1] for p in gpu.processes})
    assert _judge(gpu, Limits(ignore_processes=names)) == ("free", "")


@pytest.mark.parametrize(
    "gpu, state, reason",
    [
        (
            _csv(H100_MIG),
            "busy-unclaimed",
            "11125 MiB in use by processes we cannot see, and no claim",
        ),
        (_xml(A100_MIG)[0], "free", ""),  # 50 MiB: the driver's own
        (_csv(GB10), "free", ""),  # unified memory: no number, no processes
    ],
)
def test_without_visible_processes_memory_in_use_decides(gpu: Gpu, state: str, reason: str) -> None:
    assert _judge(gpu) == (state, reason)


def test_no_visible_processes_judged_against_the_threshold() -> None:
    gpu = _csv(H100_MIG)  # 11125 MiB used
    assert _judge(gpu, Limits(busy_memory_mib=11126))[0] == "free"
    assert _judge(gpu, Limits(busy_memory_mib=11125))[0] == "busy-unclaimed"


def test_a_claimed_gpu_is_claimed_even_when_busy(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    gpu = _xml(A5000)[0]
    claim = hold(store, NODE, [(gpu.uuid, 0)])
    snap = store.snapshot()
    row = judge_gpu(gpu, snap.claim_for(gpu.uuid), snap, Limits())
    assert (row.state, row.reason) == ("claimed", "")
    assert row.claim is not None and row.claim.id == claim.id
    assert [p.pid for p in row.foreign] == [100477]  # still known: the board shows them


def test_an_expired_claim_is_stale(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    gpu = _xml(A100_MIG)[0]
    hold(store, NODE, [(gpu.uuid, 0)], since=store.now() - 7200, expires_in=3600)
    snap = store.snapshot()
    row = judge_gpu(gpu, snap.claim_for(gpu.uuid), snap, Limits())
    assert (row.state, row.reason) == ("stale", "expired")


def test_a_damaged_claim_file_is_stale_and_says_so(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    gpu = _xml(A100_MIG)[0]
    (store.root / "gpus" / f"{gpu.uuid}.claim").write_text("{half a claim")
    snap = store.snapshot()
    row = judge_gpu(gpu, snap.claim_for(gpu.uuid), snap, Limits())
    assert row.state == "stale" and row.claim is None
    assert row.reason.startswith("claim file corrupt: ")


def test_a_claim_file_we_may_not_read_is_held_by_someone() -> None:
    gpu = _xml(A100_MIG)[0]
    cf = ClaimFile(gpu.uuid, Path("/s/gpus/x.claim"), 0.0, 1, error="unreadable: Permission denied")
    row = judge_gpu(gpu, None, Snapshot(now=0.0, files={gpu.uuid: cf}), Limits())
    assert row.state == "claimed" and row.claim is None
    assert row.reason == (
        "claim file unreadable: Permission denied: held, by whom gpuclaim cannot tell"
    )


def _booking(gpu: Gpu, start: float, end: float) -> Booking:
    return Booking("r-1", "bob", NODE, (ClaimedGpu(gpu.uuid, gpu.index),), start, end)


def test_a_free_gpu_inside_a_booking_window_is_reserved() -> None:
    gpu = _xml(A100_MIG)[0]
    now = EMPTY.now
    free = judge_gpu(gpu, None, EMPTY, Limits())
    open_now = dataclasses.replace(EMPTY, bookings=[_booking(gpu, now - 60, now + 3600)])
    row = with_booking(free, open_now)
    assert row.state == "reserved" and row.reason == "reserved by bob (reservation r-1)"
    later = dataclasses.replace(EMPTY, bookings=[_booking(gpu, now + 3600, now + 7200)])
    assert with_booking(free, later).state == "free"
    assert with_booking(free, later).booking is not None  # shown: it opens within a day
    far = dataclasses.replace(EMPTY, bookings=[_booking(gpu, now + 2 * 86400, now + 3 * 86400)])
    assert with_booking(free, far).booking is None


def test_a_busy_gpu_inside_a_booking_stays_busy() -> None:
    gpu = _xml(A5000)[0]
    now = EMPTY.now
    snap = dataclasses.replace(EMPTY, bookings=[_booking(gpu, now - 60, now + 3600)])
    row = with_booking(judge_gpu(gpu, None, snap, Limits()), snap)
    assert row.state == "busy-unclaimed" and row.booking is not None


def test_the_view_of_a_node_from_its_recorded_answer(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = parse_config({"nodes": [NODE, "gpu02"], "storage": str(tmp_path / "store")})
    gpus = _xml(A5000) + _xml(T4)
    gpus = [g.replace(index=i) for i, g in enumerate(gpus)]
    hold(store, NODE, [(gpus[1].uuid, 1)], user="ann")
    inventories = {
        NODE: NodeInventory(node=NODE, gpus=tuple(gpus)),
        "gpu02": NodeInventory(node="gpu02", reachable=False, error="ssh: timed out"),
    }
    view = build_view(config, store, inventories=inventories)
    shown = [(r.node, r.index, r.state) for r in view.rows]
    assert shown == [
        (NODE, 0, "busy-unclaimed"),
        (NODE, 1, "claimed"),
        (NODE, 2, "busy-unclaimed"),
        ("gpu02", None, "unreachable"),
    ]
    assert view.rows[-1].reason == "ssh: timed out"
    assert view.unreachable == ["gpu02"]


def test_a_claimed_gpu_the_probe_no_longer_sees_is_still_a_row(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = parse_config({"nodes": [NODE], "storage": str(tmp_path / "store")})
    gone = hold(store, NODE, [("GPU-removed", 3)], user="bob")
    view = build_view(config, store, inventories={NODE: NodeInventory(NODE, tuple(_xml(T4)))})
    row = next(r for r in view.rows if r.uuid == "GPU-removed")
    assert (row.state, row.index, row.reason, row.gpu) == (
        "claimed",
        3,
        "GPU not seen by the probe",
        None,
    )
    assert row.claim is not None and (row.claim.id, row.claim.user) == (gone.id, "bob")
