"""Claims that sit idle: sampling each look at the cluster into the usage summaries (folded by
``gpuclaim.core.usage``), and the policy.

Every look at the cluster (status, the board's refresh, a job wrapper's heartbeat) already
probes the GPUs; each probe folds one sample per claim into a few numbers kept on the
storage (``usage/<claim>.json``). A claim whose GPUs all stayed under the threshold for the
window is *idle*: its holder is told once, and (only if the admin turned it on) the claim is
released after a grace period, never one of a running job unless the admin chose that too.
Standard library only: the job wrapper samples on its node.
"""

from __future__ import annotations

from gpuclaim.core.config import Config, IdlePolicy
from gpuclaim.core.durations import format_duration
from gpuclaim.core.events import claim_event
from gpuclaim.core.model import Claim, Event, EventType
from gpuclaim.core.records import UsageSample, UsageSummary
from gpuclaim.core.states import GpuState
from gpuclaim.core.usage import Idleness, judge
from gpuclaim.engine.cluster import ClusterView
from gpuclaim.store import Store


def sample_view(view: ClusterView, store: Store, threshold_pct: float) -> dict[str, UsageSummary]:
    """Fold the utilisation this probe saw into each held claim's summary; returns them."""
    samples: dict[str, UsageSample] = {}
    for row in view.rows:
        if row.state != GpuState.CLAIMED or row.claim is None or row.gpu is None:
            continue
        entry = samples.setdefault(row.claim.id, {"since": row.claim.since, "utils": []})
        entry["utils"].append(row.gpu.utilization_pct)
    if samples:
        store.record_usage(samples=samples, threshold_pct=threshold_pct)
    return store.usage_summaries(ids=sorted(samples)) if samples else {}


def apply_policy(
    config: Config, store: Store, view: ClusterView, summaries: dict[str, UsageSummary]
) -> list[Claim]:
    """Tell holders of idle claims (once per idle spell); release them if the admin said so.
    Returns the claims released."""

    policy = config.idle
    now = view.snapshot.now
    idle_claims = []
    for cid, summary in summaries.items():
        status = view.snapshot.claims.get(cid)
        verdict = judge(summary, now, policy.window_s)
        if (
            status is None
            or status.state != GpuState.CLAIMED
            or verdict is None
            or not verdict.idle
            or status.claim.keep_when_idle  # a service: idle by design, not worth a word
        ):
            continue
        idle_claims.append((status.claim, verdict))
    by_id = {c.id: (c, v) for c, v in idle_claims}
    if policy.warn:
        for cid in store.mark_notices(scope="idle", keys=sorted(by_id)):
            claim, verdict = by_id[cid]
            store.append_event(
                Event(
                    ts=now,
                    type=EventType.CLAIM_IDLE,
                    user=claim.user,
                    claim_id=claim.id,
                    node=claim.node,
                    gpus=tuple(claim.indices),
                    reason=_idle_reason(policy, verdict),
                )
            )
    released: list[Claim] = []
    if policy.release_after_s is None:
        return released
    for claim, verdict in by_id.values():
        if verdict.idle_for_s < policy.window_s + policy.release_after_s:
            continue
        if claim.job and not policy.release_jobs:
            continue  # never a running job's GPUs unless the admin chose that
        if claim.keep_when_idle:
            continue  # a service idles at night by design (serve --idle-release to allow)
        status = view.snapshot.claims[claim.id]
        removed = False
        for gpu_uuid in status.present:
            removed |= store.remove_gpu(gpu_uuid, claim.id)
        if removed:
            reason = f"idle policy: {_idle_reason(policy, verdict)}"
            store.append_event(
                claim_event(EventType.RELEASE, claim, now, by="gpuclaim", reason=reason)
            )
            if claim.job:
                store.update_job(job_id=claim.job, changes={"stop_requested": "kill"})
            released.append(claim)
    return released


def _idle_reason(policy: IdlePolicy, verdict: Idleness) -> str:
    return f"under {policy.threshold_pct:g}% for {format_duration(verdict.idle_for_s)}"
