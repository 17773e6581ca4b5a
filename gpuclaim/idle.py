"""Claims that sit idle: a rolling summary of how busy each claim's GPUs are, and the policy.

Every look at the cluster (status, the board's refresh, a job wrapper's heartbeat) already
probes the GPUs; each probe folds one sample per claim into a few numbers kept on the
storage (``usage/<claim>.json``). A claim whose GPUs all stayed under the threshold for the
window is *idle*: its holder is told once, and (only if the admin turned it on) the claim is
released after a grace period, never one of a running job unless the admin chose that too.
Standard library only: the job wrapper samples on its node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from gpuclaim.durations import format_duration
from gpuclaim.model import Event

MAX_GAP_S = 300.0  # a sample stands for at most this long (nobody looked for an hour: unknown)
EMA_TAU_S = 3600.0  # "mean over the last hour"


def fold_sample(
    current: Optional[dict[str, Any]],
    since: float,
    now: float,
    utils: list[Optional[int]],
    threshold_pct: float,
) -> dict[str, Any]:
    """The summary after one more sample of the claim's GPUs (``None``: not measurable, as
    under MIG; counted as active, so an unmeasurable GPU is never called idle)."""
    s = dict(current or {})
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
    claim_id: str
    idle_for_s: float  # time since a GPU of the claim was last busy
    idle: bool

    def to_dict(self) -> dict[str, Any]:
        return {"idle": self.idle, "idle_for_s": round(self.idle_for_s)}


def judge(summary: Optional[dict[str, Any]], now: float, window_s: float) -> Optional[Idleness]:
    if not summary:
        return None
    idle_for = max(0.0, now - float(summary.get("last_active", now)))
    return Idleness(str(summary.get("claim", "")), idle_for, idle_for >= window_s)


def usage_view(summary: Optional[dict[str, Any]], now: float, window_s: float) -> dict[str, Any]:
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


def sample_view(view: Any, store: Any, threshold_pct: float) -> dict[str, dict[str, Any]]:
    """Fold the utilisation this probe saw into each held claim's summary; returns them."""
    samples: dict[str, dict[str, Any]] = {}
    for row in view.rows:
        if row.state != "claimed" or row.claim is None or row.gpu is None:
            continue
        entry = samples.setdefault(row.claim.id, {"since": row.claim.since, "utils": []})
        entry["utils"].append(row.gpu.utilization_pct)
    if samples:
        store.record_usage(samples=samples, threshold_pct=threshold_pct)
    return store.usage_summaries(ids=sorted(samples)) if samples else {}


def apply_policy(config: Any, store: Any, view: Any, summaries: dict[str, dict[str, Any]]) -> list:
    """Tell holders of idle claims (once per idle spell); release them if the admin said so.
    Returns the claims released."""
    from gpuclaim.claims import claim_event

    policy = config.idle
    now = view.snapshot.now
    idle_claims = []
    for cid, summary in summaries.items():
        status = view.snapshot.claims.get(cid)
        verdict = judge(summary, now, policy.window_s)
        if status is None or status.state != "claimed" or verdict is None or not verdict.idle:
            continue
        idle_claims.append((status.claim, verdict))
    by_id = {c.id: (c, v) for c, v in idle_claims}
    if policy.warn:
        for cid in store.mark_notices(scope="idle", keys=sorted(by_id)):
            claim, verdict = by_id[cid]
            store.append_event(
                Event(
                    ts=now,
                    type="claim-idle",
                    user=claim.user,
                    claim_id=claim.id,
                    node=claim.node,
                    gpus=tuple(claim.indices),
                    reason=_idle_reason(policy, verdict),
                )
            )
    released = []
    if policy.release_after_s is None:
        return released
    for claim, verdict in by_id.values():
        if verdict.idle_for_s < policy.window_s + policy.release_after_s:
            continue
        if claim.job and not policy.release_jobs:
            continue  # never a running job's GPUs unless the admin chose that
        status = view.snapshot.claims[claim.id]
        removed = False
        for gpu_uuid in status.present:
            removed |= store.remove_gpu(gpu_uuid, claim.id)
        if removed:
            reason = f"idle policy: {_idle_reason(policy, verdict)}"
            store.append_event(claim_event("release", claim, now, by="gpuclaim", reason=reason))
            if claim.job:
                store.update_job(job_id=claim.job, changes={"stop_requested": "kill"})
            released.append(claim)
    return released


def _idle_reason(policy: Any, verdict: Idleness) -> str:
    return f"under {policy.threshold_pct:g}% for {format_duration(verdict.idle_for_s)}"
