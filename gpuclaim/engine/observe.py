"""What every look at the GPUs does besides showing them: ``status`` and the board alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from gpuclaim.core.config import Config
from gpuclaim.core.errors import StorageRefusesWrites
from gpuclaim.core.records import UsageSummary
from gpuclaim.core.states import GpuState
from gpuclaim.engine.cluster import ClusterView
from gpuclaim.engine.idle import apply_policy, sample_view
from gpuclaim.engine.policy import lab_config
from gpuclaim.engine.services import Revival, revive_services
from gpuclaim.store import Store

if TYPE_CHECKING:  # claims, launch, notify: imported where a look has their work (~10 ms)
    from gpuclaim.engine.launch import NodeOps


@dataclass
class FollowUp:
    """What a look recorded: the claims' usage summaries, why nothing could be recorded when
    the storage refuses writes (the look still shows what it holds; summaries are only read),
    and the services it started again."""

    summaries: dict[str, UsageSummary]
    refusal: Optional[StorageRefusesWrites] = None
    revival: Revival = field(default_factory=Revival)


def follow_up_look(
    config: Config, store: Store, view: ClusterView, ops: Optional[NodeOps] = None
) -> FollowUp:
    """Record what the look found: jobs found lost, the usage it saw, the idle policy, Slack
    notices; with ``ops``, start the services found down on nodes that answered."""
    revival = Revival()
    config = lab_config(config, store)  # the lab's idle policy, whoever looks
    try:
        for status in view.snapshot.claims.values():
            if status.reason == "job lost" and status.claim.job:
                from gpuclaim.engine.claims import finish_lost_claim  # here: only for a lost job

                finish_lost_claim(store, status.claim)
        if ops is not None:
            revival = revive_services(config, store, view, ops)
        summaries = sample_view(view, store, config.idle.threshold_pct)
        apply_policy(config, store, view, summaries)
        if config.slack.webhook_url:
            from gpuclaim.engine.notify import record_notices  # here: only with Slack

            record_notices(view, store)
    except StorageRefusesWrites as exc:
        held = sorted({r.claim.id for r in view.rows if r.claim and r.state == GpuState.CLAIMED})
        return FollowUp(store.usage_summaries(ids=held) if held else {}, exc, revival)
    return FollowUp(summaries, None, revival)
