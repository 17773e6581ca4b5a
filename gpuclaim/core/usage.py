"""How busy a claim's GPUs are: a rolling summary folded one sample at a time, and the verdict
idle or not. Pure arithmetic; the store keeps the summaries, the idle policy acts on them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from gpuclaim.core.records import UsageSummary

MAX_GAP_S = 300.0  # a sample stands for at most this long (nobody looked for an hour: unknown)
EMA_TAU_S = 3600.0  # "mean over the last hour"


def fold_sample(
    current: Optional[UsageSummary],
    since: float,
    now: float,
    utils: list[Optional[int]],
    threshold_pct: float,
) -> UsageSummary:
    """The summary after one more sample of the claim's GPUs (``None``: not measurable, as
    under MIG; counted as active, so an unmeasurable GPU is never called idle)."""
    s: UsageSummary = current.copy() if current else {}
    last = float(s.get("last", since))
    dt = max(0.0, min(now - last, MAX_GAP_S)) if current else 0.0
    known = [u for u in utils if u is not None]
    mean = sum(known) / len(known) if known else 0.0
    active = (not known) or len(known) < len(utils) or max(known) >= threshold_pct
    busy = sum(u for u in known) / 100.0
    s["since"] = since
    s["last"] = now
    s["samples"] = int(s.get("samples", 0)) + 1
    s["gpus"] = len(utils)
    s["held_gpu_s"] = float(s.get("held_gpu_s", 0.0)) + len(utils) * dt
    s["busy_gpu_s"] = float(s.get("busy_gpu_s", 0.0)) + busy * dt
    weight = 1 - math.exp(-dt / EMA_TAU_S) if current else 1.0
    s["mean_pct"] = round(
        float(s.get("mean_pct", mean)) + (mean - float(s.get("mean_pct", mean))) * weight, 2
    )
    s["max_pct"] = max(float(s.get("max_pct", 0.0)), max(known) if known else 0.0)
    if active or "last_active" not in s:
        s["last_active"] = now if active else since
    return s


@dataclass(frozen=True)
class Idleness:
    """How long a claim's GPUs have been idle, and whether that is past the idle window."""

    idle_for_s: float  # time since a GPU of the claim was last busy
    idle: bool

    def to_dict(self) -> dict[str, Any]:
        return {"idle": self.idle, "idle_for_s": round(self.idle_for_s)}


def judge(summary: Optional[UsageSummary], now: float, window_s: float) -> Optional[Idleness]:
    if not summary:
        return None
    idle_for = max(0.0, now - float(summary.get("last_active", now)))
    return Idleness(idle_for, idle_for >= window_s)


def usage_view(summary: Optional[UsageSummary], now: float, window_s: float) -> dict[str, Any]:
    """The fields ``status --json`` adds to a claim."""
    if not summary:
        return {"idle": False, "idle_for_s": None, "mean_pct": None, "max_pct": None}
    idle = judge(summary, now, window_s)
    assert idle is not None
    return {
        **idle.to_dict(),
        "mean_pct": summary.get("mean_pct"),
        "max_pct": summary.get("max_pct"),
        "busy_gpu_hours": round(float(summary.get("busy_gpu_s", 0)) / 3600, 3),
        "sampled_gpu_hours": round(float(summary.get("held_gpu_s", 0)) / 3600, 3),
    }
