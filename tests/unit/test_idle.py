"""Idle claims: folding utilisation samples into a claim's summary (core/usage.py, pure, the
clock given), and the idle policy (engine/idle.py) over a view built from recorded nvidia-smi
answers and a temporary store."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gpuclaim.core.config import parse_config
from gpuclaim.core.model import Gpu, NodeInventory
from gpuclaim.core.usage import EMA_TAU_S, MAX_GAP_S, fold_sample, judge, usage_view
from gpuclaim.engine.cluster import ClusterView, build_view
from gpuclaim.engine.idle import apply_policy, sample_view
from gpuclaim.node.probe.smi_parse import parse_query_xml
from gpuclaim.store import ClaimStore
from tests.unit.job_factory import add_job, hold, new_store

T0 = 1_800_000_000.0
A5000 = (
    Path(__file__).parent.parent
    / "fixtures"
    / "nvidia-smi"
    / ("09_2x-rtx-a5000_drv590.44.01_q-x_v13_procs.xml")
)
NODE = "gpu01"


def _fold(samples: list[tuple[float, list[int | None]]], threshold: float = 5.0) -> dict:
    summary: dict[str, Any] | None = None
    for t, utils in samples:
        summary = fold_sample(summary, T0, t, utils, threshold)
    assert summary is not None
    return summary


def test_the_first_sample_counts_no_time_yet() -> None:
    s = fold_sample(None, T0, T0 + 30, [40, 60], 5.0)
    assert (s["samples"], s["gpus"], s["held_gpu_s"], s["busy_gpu_s"]) == (1, 2, 0.0, 0.0)
    assert (s["mean_pct"], s["max_pct"], s["last"], s["since"]) == (50.0, 60.0, T0 + 30, T0)
    assert s["last_active"] == T0 + 30


def test_an_idle_first_sample_is_idle_since_the_claim_began() -> None:
    assert fold_sample(None, T0, T0 + 30, [0, 1], 5.0)["last_active"] == T0


def test_held_and_busy_gpu_seconds_add_up_between_samples() -> None:
    s = _fold([(T0, [0, 0]), (T0 + 60, [100, 50]), (T0 + 120, [20, 0])])
    assert s["samples"] == 3
    assert s["held_gpu_s"] == 2 * 120  # two GPUs for two minutes
    assert s["busy_gpu_s"] == pytest.approx(1.5 * 60 + 0.2 * 60)
    assert s["max_pct"] == 100


def test_a_gap_counts_at_most_max_gap_and_a_clock_going_back_counts_nothing() -> None:
    s = _fold([(T0, [10]), (T0 + 3600, [10])])
    assert s["held_gpu_s"] == MAX_GAP_S
    back = fold_sample(s, T0, T0 + 3000, [10], 5.0)
    assert back["held_gpu_s"] == MAX_GAP_S and back["last"] == T0 + 3000


def test_the_mean_moves_towards_a_sample_by_its_share_of_an_hour() -> None:
    s = _fold([(T0, [0]), (T0 + MAX_GAP_S, [100])])
    assert s["mean_pct"] == pytest.approx(100 * (1 - math.exp(-MAX_GAP_S / EMA_TAU_S)), abs=0.01)
    steady = _fold([(T0 + 60 * i, [30]) for i in range(5)])
    assert steady["mean_pct"] == 30.0


def test_last_active_is_the_last_sample_over_the_threshold() -> None:
    s = _fold([(T0, [50]), (T0 + 60, [4]), (T0 + 120, [4, 0])])
    assert s["last_active"] == T0
    s = fold_sample(s, T0, T0 + 180, [0, 5], 5.0)  # at the threshold counts as active
    assert s["last_active"] == T0 + 180


@pytest.mark.parametrize("utils", [[None], [None, None], [0, None]])
def test_a_gpu_that_cannot_be_measured_is_never_idle(utils: list[int | None]) -> None:
    s = _fold([(T0, [0]), (T0 + 60, utils)])
    assert s["last_active"] == T0 + 60
    assert s["busy_gpu_s"] == 0.0  # unknown is not counted as work either


def test_judge_calls_it_idle_from_the_window_on() -> None:
    summary = {"claim": "c-1", "last_active": T0}
    assert judge(None, T0, 60) is None and judge({}, T0, 60) is None
    assert judge(summary, T0 + 59, 60).idle is False  # type: ignore[union-attr]
    verdict = judge(summary, T0 + 60, 60)
    assert verdict is not None and verdict.idle and verdict.idle_for_s == 60
    assert verdict.to_dict() == {"idle": True, "idle_for_s": 60}
    assert judge(summary, T0 - 10, 60).idle_for_s == 0  # type: ignore[union-attr]


def test_usage_view_in_status_json() -> None:
    assert usage_view(None, T0, 60) == {
        "idle": False,
        "idle_for_s": None,
        "mean_pct": None,
        "max_pct": None,
    }
    summary = _fold([(T0, [0, 0]), (T0 + 300, [0, 0])])
    assert usage_view(summary, T0 + 1800, 1800) == {
        "idle": True,
        "idle_for_s": 1800,
        "mean_pct": 0.0,
        "max_pct": 0.0,
        "busy_gpu_hours": 0.0,
        "sampled_gpu_hours": round(600 / 3600, 3),
    }


# --- the policy, over a store ------------------------------------------------------------


def _config(tmp_path: Path, **idle: Any):  # -> Config
    raw = {"nodes": [NODE], "storage": str(tmp_path / "store"), "idle": idle}
    return parse_config(raw)


def _gpus() -> list[Gpu]:
    return parse_query_xml(A5000.read_text(), NODE)[0]  # both at 0 %


def _view(config: Any, store: ClaimStore, gpus: list[Gpu]) -> ClusterView:
    return build_view(config, store, inventories={NODE: NodeInventory(NODE, tuple(gpus))})


def test_a_look_folds_one_sample_per_claim_from_the_probe(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = _config(tmp_path)
    gpus = _gpus()
    gpus[1] = gpus[1].replace(utilization_pct=80)
    claim = hold(store, NODE, [(g.uuid, g.index) for g in gpus])
    summaries = sample_view(_view(config, store, gpus), store, 5.0)
    assert set(summaries) == {claim.id}
    assert (summaries[claim.id]["gpus"], summaries[claim.id]["max_pct"]) == (2, 80)
    again = sample_view(_view(config, store, gpus), store, 5.0)
    assert again[claim.id]["samples"] == 2


def test_a_look_with_no_claims_writes_nothing(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    assert sample_view(_view(_config(tmp_path), store, _gpus()), store, 5.0) == {}
    assert store.usage_summaries() == {}


def _idle_for(view: ClusterView, claim_id: str, seconds: float) -> dict[str, dict[str, Any]]:
    return {claim_id: {"claim": claim_id, "last_active": view.snapshot.now - seconds}}


def _events(store: ClaimStore, kind: str) -> list:
    return [e for e in store.read_events()[0] if e.type == kind]


def test_the_holder_of_an_idle_claim_is_told_once_per_idle_spell(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = _config(tmp_path, window="30m")
    gpu = _gpus()[0]
    claim = hold(store, NODE, [(gpu.uuid, 0)])
    view = _view(config, store, _gpus())
    assert apply_policy(config, store, view, _idle_for(view, claim.id, 1799)) == []
    assert not _events(store, "claim-idle")
    apply_policy(config, store, view, _idle_for(view, claim.id, 1800))
    apply_policy(config, store, view, _idle_for(view, claim.id, 2400))
    [told] = _events(store, "claim-idle")
    assert (told.user, told.claim_id, told.gpus) == ("ann", claim.id, (0,))
    assert told.reason == "under 5% for 30m"
    apply_policy(config, store, view, _idle_for(view, claim.id, 0))  # busy again: spell over
    apply_policy(config, store, view, _idle_for(view, claim.id, 1800))
    assert len(_events(store, "claim-idle")) == 2
    assert store.snapshot().claims  # warned, never released without release_after


def test_no_warning_when_warn_is_off(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = _config(tmp_path, window="30m", warn=False)
    claim = hold(store, NODE, [(_gpus()[0].uuid, 0)])
    view = _view(config, store, _gpus())
    assert apply_policy(config, store, view, _idle_for(view, claim.id, 7200)) == []
    assert not _events(store, "claim-idle")


def test_an_idle_claim_is_released_after_the_window_and_the_grace(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = _config(tmp_path, window="30m", release_after="1h", threshold_pct=10)
    claim = hold(store, NODE, [(g.uuid, g.index) for g in _gpus()])
    view = _view(config, store, _gpus())
    assert apply_policy(config, store, view, _idle_for(view, claim.id, 5399)) == []
    assert claim.id in store.snapshot().claims
    released = apply_policy(config, store, view, _idle_for(view, claim.id, 5400))
    assert [c.id for c in released] == [claim.id]
    assert store.snapshot().claims == {}
    [release] = _events(store, "release")
    assert (release.by, release.reason) == ("gpuclaim", "idle policy: under 10% for 1h30m")


def test_a_running_jobs_claim_is_released_only_if_the_admin_chose_that(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    gpu = _gpus()[0]
    job = add_job(store, "j1")
    claim = hold(store, NODE, [(gpu.uuid, 0)], job="j1")
    store.beat(claim_id=claim.id, interval=10)  # its wrapper is alive
    spared = _config(tmp_path, window="30m", release_after="1h")
    view = _view(spared, store, _gpus())
    assert apply_policy(spared, store, view, _idle_for(view, claim.id, 86400)) == []
    assert store.load_job("j1").stop_requested is None  # type: ignore[union-attr]

    chosen = _config(tmp_path, window="30m", release_after="1h", release_jobs=True)
    released = apply_policy(chosen, store, view, _idle_for(view, claim.id, 86400))
    assert [c.id for c in released] == [claim.id]
    assert store.load_job(job.id).stop_requested == "kill"  # type: ignore[union-attr]


def test_a_stale_claim_is_neither_warned_about_nor_released(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    config = _config(tmp_path, window="30m", release_after="1h")
    expired = hold(store, NODE, [(_gpus()[0].uuid, 0)], since=store.now() - 7200, expires_in=60)
    view = _view(config, store, _gpus())
    assert view.snapshot.claims[expired.id].state == "stale"
    assert apply_policy(config, store, view, _idle_for(view, expired.id, 86400)) == []
    assert not _events(store, "claim-idle") and not _events(store, "release")
