"""The job wrapper: runs inside a rank's tmux session and owns the job's life.

It pins the GPUs (checked by UUID), runs the command with its argv untouched (no shell
anywhere), copies its output to the log, enforces the time limit (TERM, grace, KILL), beats a
heartbeat, records the exit status, releases the claim, and starts queued jobs that now fit on
this node. The laptop may be closed the whole time. Standard library only, Python 3.9.
"""

import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.node.runner import free_port

POLL_S = 0.5


class Wrapper:
    """Runs one rank of a job from its spec file to the recorded end."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from gpuclaim.core.model import Job
        from gpuclaim.store import ClaimStore

        self.spec = spec
        self.job = Job.from_dict(spec["job"])
        self.rank = int(spec["rank"])
        self.me = self.job.ranks[self.rank]
        self.store = ClaimStore(Path(spec["store_root"]))
        self.beat_s = float(spec.get("beat_s", 5.0))
        self.grace_s = float(spec.get("grace_s", 30.0))
        self.sample_s = float(spec.get("sample_s", 60.0))
        self.log_path = Path(spec["log"])
        self.stop_reason: Optional[str] = None
        self.child: Optional[subprocess.Popen[bytes]] = None
        self.interactive = self.job.kind == "shell"
        self._notifier: Optional[threading.Thread] = None

    def run(self) -> int:
        signal.signal(signal.SIGHUP, self._on_hangup)
        signal.signal(signal.SIGTERM, self._on_hangup)
        log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the job
        try:
            self._beat()
            env, error = self._environment()
            if error:
                log.write(f"gpuclaim: {error}\n".encode())
                return self._finish("failed", None, error)
            return self._supervise(env, log)
        except Exception as exc:  # the claim must be released whatever went wrong
            log.write(f"gpuclaim: wrapper error: {exc}\n".encode())
            return self._finish("failed", None, f"wrapper error: {exc}")
        finally:
            log.close()

    def _on_hangup(self, signum: int, frame: Any) -> None:
        # The tmux session or server went away: stop the job rather than leave it unmanaged.
        self.stop_reason = self.stop_reason or "killed"

    def _environment(self) -> tuple[dict[str, str], Optional[str]]:
        from gpuclaim.node.probe.local import probe_local

        node_env = dict(self.spec.get("node_env") or {})
        inventory = probe_local(
            self.me.node,
            tuple(self.spec.get("nvidia_smi") or ()),
            node_env,
            float(self.spec.get("probe_timeout", 10.0)),
        )
        if inventory.error:
            return {}, f"cannot check the GPUs before starting: {inventory.error}"
        index_of = {g.uuid: g.index for g in inventory.gpus}
        missing = [u for u in self.me.gpu_uuids if u not in index_of]
        if missing:
            return {}, f"claimed GPU {missing[0]} is not on this node any more"
        if self.job.visible_as == "uuid":
            visible = ",".join(self.me.gpu_uuids)
        else:
            visible = ",".join(str(index_of[u]) for u in self.me.gpu_uuids)
        env = dict(os.environ)
        env.update(node_env)
        env.update(dict(self.job.env))
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": visible,
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # indices as nvidia-smi numbers them
                "GPUCLAIM_JOB": self.job.name,
                "GPUCLAIM_JOB_ID": self.job.id,
            }
        )
        env.update({k: str(v) for k, v in (self.spec.get("gang") or {}).items()})
        return env, None

    def _resolve_argv(self) -> list[str]:
        """Interactive kinds are resolved here, on the node: its shell, its jupyter."""
        if self.job.kind == "shell":
            return [os.environ.get("SHELL") or "/bin/bash", "-l"]
        if self.job.kind == "notebook":
            jupyter = shutil.which("jupyter")
            if jupyter is None:
                raise GpuclaimError(
                    "jupyter is not installed on this node (pip install jupyterlab there)"
                )
            port = free_port()
            self.store.update_job(job_id=self.job.id, changes={"port": port})
            return [jupyter, "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}"]
        return list(self.job.argv)

    def _supervise(self, env: dict[str, str], log: Any) -> int:
        started = self.store.now()
        deadline = time.monotonic() + self.job.time_limit_s
        cwd = str(Path(self.job.workdir).expanduser()) if self.job.workdir else str(Path.home())
        try:
            self._check_workdir(cwd)
            argv = self._resolve_argv()
        except GpuclaimError as exc:
            log.write(f"gpuclaim: {exc}\n".encode())
            return self._finish("failed", None, str(exc))
        try:
            if self.interactive:
                self.child = subprocess.Popen(argv, cwd=cwd, env=env)
            else:
                self.child = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: we signal all of it
                )
        except OSError as exc:
            message, code = self._start_error(exc, argv[0], cwd)
            log.write(f"gpuclaim: {message}\n".encode())
            return self._finish("failed", code, message)
        self._record_start(started)
        next_beat = time.monotonic() + self.beat_s
        next_sample = time.monotonic() + self.sample_s
        next_check = time.monotonic() + 1.0
        stop_sent: Optional[float] = None
        out = self.child.stdout
        while True:
            if out is not None:
                self._pump(out, log, POLL_S)
            else:
                time.sleep(POLL_S)
            if self.child.poll() is not None:
                break
            now = time.monotonic()
            if self.stop_reason is None and now > deadline:
                self.stop_reason = "timeout"
            if now > next_check:
                next_check = now + 1.0
                self._check_stop_request()
            if self.stop_reason is not None:
                if stop_sent is None:
                    stop_sent = now
                    log.write(f"\ngpuclaim: stopping ({self.stop_reason}): SIGTERM\n".encode())
                    self._signal(signal.SIGTERM)
                elif now - stop_sent > self.grace_s:
                    log.write(b"gpuclaim: still running after the grace period: SIGKILL\n")
                    self._signal(signal.SIGKILL)
                    stop_sent = float("inf")
            if now > next_beat:
                next_beat = now + self.beat_s
                self._beat()
            if now > next_sample:
                next_sample = now + self.sample_s
                self._sample_usage()
        if out is not None:
            self._pump(out, log, 0.2, drain=True)
        self._signal(signal.SIGKILL)  # leftovers of the job's process group hold GPU memory
        code = self.child.returncode
        exit_code = code if code >= 0 else 128 - code
        if self.stop_reason == "timeout":
            return self._finish("timeout", exit_code, "time limit reached")
        if self.stop_reason is not None:
            return self._finish("killed", exit_code, self.job.stop_requested or "killed")
        if code == 0:
            return self._finish("succeeded", 0, "")
        return self._finish("failed", exit_code, f"exit status {exit_code}")

    def _check_workdir(self, cwd: str) -> None:
        """Say which path is missing, and where: not ``cannot start 'python3'``."""
        if not Path(cwd).is_dir():
            what = "is not a directory" if Path(cwd).exists() else "does not exist"
            raise GpuclaimError(f"workdir {cwd} {what} on {self.me.node}")

    def _start_error(self, exc: OSError, program: str, cwd: str) -> tuple[str, Optional[int]]:
        """The message and exit code of a command that could not start: as a shell says it,
        127 for a command that is not there, 126 for one that cannot run."""
        if exc.filename == cwd:  # the workdir, which went away or cannot be entered
            return f"cannot enter workdir {cwd} on {self.me.node}: {exc.strerror}", None
        where = f"cannot start {program!r} on {self.me.node}"
        if exc.errno == errno.ENOENT:
            hint = "" if "/" in program else " (not on the PATH there)"
            return f"{where}: {exc.strerror}{hint}", 127
        return f"{where}: {exc.strerror}", 126

    def _pump(self, out: Any, log: Any, timeout: float, drain: bool = False) -> None:
        fd = out.fileno()
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if not ready:
                return
            data = os.read(fd, 65536)
            if not data:
                return
            log.write(data)
            try:
                sys.stdout.buffer.write(data)  # the tmux pane, for `gpuclaim attach`
                sys.stdout.buffer.flush()
            except OSError:
                pass
            if not drain and time.monotonic() > end:
                return

    def _signal(self, sig: int) -> None:
        if self.child is None:
            return
        try:
            if self.interactive:
                self.child.send_signal(sig)
            else:
                os.killpg(self.child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

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
            tuple(self.spec.get("nvidia_smi") or ()),
            dict(self.spec.get("node_env") or {}),
            float(self.spec.get("probe_timeout", 10.0)),
        )
        util = {g.uuid: g.utilization_pct for g in inventory.gpus}
        if inventory.error or not all(u in util for u in self.me.gpu_uuids):
            return
        sample = {
            "since": float(self.spec.get("claim_since", 0.0)) or self.job.submitted,
            "utils": [util[u] for u in self.me.gpu_uuids],
        }
        try:
            self.store.record_usage(
                samples={self.me.claim_id: sample},
                threshold_pct=float(self.spec.get("idle_threshold_pct", 5.0)),
            )
        except GpuclaimError:
            pass

    def _check_stop_request(self) -> None:
        try:
            current = self.store.load_job_dict(self.job.id)
        except GpuclaimError:
            return
        if current and current.get("stop_requested") and self.stop_reason is None:
            self.stop_reason = "killed"
            self.job = self.job.with_(stop_requested=current["stop_requested"])

    def _record_start(self, started: float) -> None:
        from gpuclaim.core.model import iso

        self.store.update_job(
            job_id=self.job.id,
            changes={},
            rank=self.rank,
            rank_changes={"state": "running", "started": iso(started)},
        )
        result = self.store.update_job(
            job_id=self.job.id,
            changes={"state": "running", "started": iso(started)},
            only_from=["starting"],
        )
        if result["applied"]:
            from gpuclaim.core.events import job_event
            from gpuclaim.core.model import Job

            self.store.append_event(job_event("job-start", Job.from_dict(result["job"]), started))
            # Tell Slack from here, beside the running job, without holding up its output.
            self._notifier = threading.Thread(target=self._notify, daemon=True)
            self._notifier.start()

    def _notify(self, budget_s: float = 5.0) -> None:
        raw = self.spec.get("config")
        if not raw or not (raw.get("slack") or {}).get("webhook_url"):
            return
        try:
            from gpuclaim.core.config import parse_config
            from gpuclaim.engine.notify import deliver

            deliver(parse_config(raw), self.store, budget_s=budget_s)
        except GpuclaimError:
            pass  # the next deliverer (any gpuclaim call, this job's end) tries again

    def _finish(self, state: str, exit_code: Optional[int], reason: str) -> int:
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
        raw = self.spec.get("config")
        if raw is None:
            return
        try:
            from gpuclaim.core.config import parse_config
            from gpuclaim.engine.jobs import dispatch_queue
            from gpuclaim.engine.notify import deliver
            from gpuclaim.node.channel import local_prober

            config = parse_config(raw)
            node = self.me.node
            dispatch_queue(config, self.store, local_prober(config, node), only_node=node)
            if self.store.queue_entries():  # still waiting: someone must notice expiries here
                from gpuclaim.node.home import start_keeper

                root = self.spec["store_root"]
                start_keeper({"node": self.me.node, "store_root": root, "config": raw})
            if self._notifier is not None:
                self._notifier.join(timeout=10)
            if config.slack.webhook_url:
                deliver(config, self.store, budget_s=10.0)
        except GpuclaimError as exc:
            with open(self.log_path, "ab") as log:
                log.write(f"gpuclaim: after the job: {exc}\n".encode())


def run_wrapper(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    return Wrapper(spec).run()
