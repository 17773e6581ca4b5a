"""What a job wrapper records about its rank, and what it does when the rank ends.

The heartbeat, usage samples for the idle summary, stop requests read from the job's record,
the rank's start and end (which releases its claim), Slack notices, and the queue dispatch on
this node once its GPUs are free. Standard library only, Python 3.9.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from gpuclaim.core.errors import GpuclaimError, IllegalTransition
from gpuclaim.core.model import EventType, JobKind
from gpuclaim.core.records import UsageSample
from gpuclaim.core.share_policy import SharePolicy
from gpuclaim.core.states import JobState

if TYPE_CHECKING:
    from gpuclaim.core.inventory import Gpu
    from gpuclaim.core.protocol import KeeperSpec, WrapperSpec


# what a run stopped by a signal from outside gpuclaim says it ended of (not a `gpuclaim kill`)
HANGUP_REASONS: dict[int, str] = {
    int(signal.SIGHUP): "its tmux session went away (SIGHUP)",
    int(signal.SIGTERM): "SIGTERM from outside gpuclaim",
}


class RankRecord:
    """One rank of a job as its wrapper sees it: the spec, the job, the store."""

    def __init__(self, spec: WrapperSpec) -> None:
        from gpuclaim.core.model import Job
        from gpuclaim.store import ClaimStore

        self.spec = spec
        self.job = Job.from_dict(spec["job"])
        self.rank = int(spec["rank"])
        self.me = self.job.ranks[self.rank]
        self.store = ClaimStore(Path(spec["store_root"]))
        self.beat_s = float(spec["beat_s"])
        self.grace_s = float(spec["grace_s"])
        self.sample_s = float(spec["sample_s"])
        self.log_path = Path(spec["log"])
        self.stop_reason: Optional[JobState] = None  # killed or timeout: how it ends
        self.hangup = 0  # the signal from outside that stopped it (SIGHUP, SIGTERM), if one
        self.extended_s = 0.0  # time added to its limit by `extend` since it started
        self.child: Optional[subprocess.Popen[bytes]] = None
        self.interactive = self.job.kind == JobKind.SHELL
        self._notifier: Optional[threading.Thread] = None
        self.share_notes: list[str] = []  # what the log says of a share's limits
        self.share_flagged = False  # used more than its share: said once

    @property
    def share_policy(self) -> SharePolicy:
        from gpuclaim.core.errors import ConfigError
        from gpuclaim.core.share_policy import parse_share_policy

        raw = self.spec["config"].get("share")
        try:
            return parse_share_policy(raw if isinstance(raw, dict) else {})
        except ConfigError:
            return SharePolicy()  # the laptop checked it; an older one's config is no share

    def _beat(self) -> None:
        if self.me.claim_id:
            try:
                self.store.beat(claim_id=self.me.claim_id, interval=self.beat_s)
            except GpuclaimError:
                pass  # storage hiccup: the next beat tries again

    def _sample_usage(self) -> None:
        """How busy our GPUs are, for the idle summary, even when nobody looks."""
        from gpuclaim.node.probe.local import probe_local

        if not self.me.claim_id:
            return
        inventory = probe_local(
            self.me.node,
            tuple(self.spec["nvidia_smi"]),
            dict(self.spec["node_env"]),
            float(self.spec["probe_timeout"]),
        )
        util = {g.uuid: g.utilization_pct for g in inventory.gpus}
        if inventory.error or not all(u in util for u in self.me.gpu_uuids):
            return
        if self.me.mem_mib:
            self._check_share(inventory.gpus)
        sample: UsageSample = {
            "since": self.job.submitted,
            "utils": [util[u] for u in self.me.gpu_uuids],
        }
        try:
            self.store.record_usage(
                samples={self.me.claim_id: sample},
                threshold_pct=float(self.spec["idle_threshold_pct"]),
            )
        except GpuclaimError:
            pass

    def _check_share(self, gpus: Sequence[Gpu]) -> None:
        """A share's processes using more of the GPU than the share: said once (event,
        Slack, the log); with ``[share] enforce = "kill"``, the job is stopped for it."""
        from gpuclaim.node.share_env import job_pids, share_used_mib

        if self.share_flagged or self.child is None:
            return
        used = share_used_mib(gpus, self.me.gpu_uuids, job_pids(self.child.pid))
        if used <= self.me.mem_mib:
            return
        self.share_flagged = True
        from gpuclaim.core.events import job_event

        enforce = self.share_policy.enforce
        why = f"used {used} MiB, more than its share of {self.me.mem_mib} MiB"
        more = {"used_mib": used, "share_mib": self.me.mem_mib, "enforce": enforce}
        event = job_event(EventType.SHARE_EXCEEDED, self.job, self.store.now(), more)
        try:
            self.store.append_event(event)
            self.store.mark_notices(scope="share", keys=[self.me.claim_id or self.job.id])
        except GpuclaimError:
            pass
        with open(self.log_path, "ab") as log:
            then = "; stopping it ([share] enforce = kill)" if enforce == "kill" else ""
            log.write(f"\ngpuclaim: this job {why}{then}\n".encode())
        if enforce == "kill" and self.stop_reason is None:
            self.stop_reason = JobState.KILLED
            self.job = self.job.with_(stop_requested=why)

    def _check_stop_request(self) -> None:
        try:
            current = self.store.load_job(self.job.id)
        except GpuclaimError:
            return
        if current and current.time_limit_s > self.job.time_limit_s:  # gpuclaim extend
            self.extended_s += current.time_limit_s - self.job.time_limit_s
            self.job = self.job.with_(time_limit_s=current.time_limit_s)
        if current and current.stop_requested and self.stop_reason is None:
            preempted = current.stop_requested == "preempt"  # engine.preempt's request
            self.stop_reason = JobState.PREEMPTED if preempted else JobState.KILLED
            self.job = self.job.with_(
                stop_requested=current.stop_requested,
                preempted_by=current.preempted_by,
                preempt_deadline=current.preempt_deadline,
            )

    def kill_reason(self) -> str:
        """Why a killed run was stopped: the request it read (kill, idle policy, its share),
        one it had not read yet when its session was killed, or the signal from outside."""
        if self.job.stop_requested:
            return self.job.stop_requested
        try:
            current = self.store.load_job(self.job.id)
        except GpuclaimError:
            current = None
        if current is not None and current.stop_requested:
            return current.stop_requested
        if self.hangup:
            return HANGUP_REASONS.get(self.hangup, f"signal {self.hangup} from outside gpuclaim")
        return JobState.KILLED.value

    def _record_start(self, started: float) -> None:
        from gpuclaim.core.model import iso

        try:
            self.store.update_job(
                job_id=self.job.id,
                changes={},
                rank=self.rank,
                rank_changes={"state": JobState.RUNNING, "started": iso(started)},
            )
        except IllegalTransition:
            # Its end was recorded first (killed or judged lost while it was starting, or a
            # launch whose answer was lost recorded as "could not start", its claim given
            # back): that end stands, so this run stops at once. It must not go on with GPUs
            # nobody holds for it.
            self._check_stop_request()
            self.stop_reason = self.stop_reason or JobState.KILLED
            return
        result = self.store.update_job(
            job_id=self.job.id,
            changes={"state": JobState.RUNNING, "started": iso(started)},
            only_from=[JobState.STARTING],
        )
        if result.applied:
            from gpuclaim.core.events import job_event
            from gpuclaim.engine.array_records import note_task_start

            started_job = result.job
            self.store.append_event(job_event(EventType.JOB_START, started_job, started))
            note_task_start(self.store, started_job)
            # Tell Slack from here, beside the running job, without holding up its output.
            self._notifier = threading.Thread(target=self._notify, daemon=True)
            self._notifier.start()

    def _notify(self, budget_s: float = 5.0) -> None:
        raw = self.spec["config"]
        if not raw or not (raw.get("slack") or {}).get("webhook_url"):
            return
        try:
            from gpuclaim.core.config import parse_config
            from gpuclaim.engine.notify import deliver

            deliver(parse_config(raw), self.store, budget_s=budget_s)
        except GpuclaimError:
            pass  # the next deliverer (any gpuclaim call, this job's end) tries again

    def _finish(self, state: JobState, exit_code: Optional[int], reason: str) -> int:
        from gpuclaim.engine.job_records import finish_rank

        finish_rank(self.store, self.job, self.rank, state, exit_code, reason, self._log_tail())
        self._after_end()
        return 0

    def _log_tail(self, lines: int = 12) -> str:
        try:
            data = self.log_path.read_bytes()[-8192:]
        except OSError:
            return ""
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    def _after_end(self) -> None:
        """Our GPUs are free: start queued jobs that fit on this node (no daemon needed), then
        tell Slack, from here, since the laptop may be closed."""
        raw = self.spec["config"]  # always there: rank_spec writes the config it ran with
        try:
            from gpuclaim.core.config import parse_config
            from gpuclaim.engine.dispatch import dispatch_queue
            from gpuclaim.engine.notify import deliver
            from gpuclaim.node.channel import local_prober

            config = parse_config(raw)
            node = self.me.node
            dispatch_queue(config, self.store, local_prober(config, node), only_node=node)
            if self.store.queue_entries():  # still waiting: someone must notice expiries here
                from gpuclaim.node.home import start_keeper

                keeper: KeeperSpec = {
                    "node": self.me.node,
                    "store_root": self.spec["store_root"],
                    "config": raw,
                }
                start_keeper(keeper)
            if self._notifier is not None:
                self._notifier.join(timeout=10)
            if config.slack.webhook_url:
                deliver(config, self.store, budget_s=10.0)
        except GpuclaimError as exc:
            with open(self.log_path, "ab") as log:
                log.write(f"gpuclaim: after the job: {exc}\n".encode())
