"""The job wrapper: runs inside a rank's tmux session and owns the job's life.

It pins the GPUs (checked by UUID), runs the command with its argv untouched (no shell
anywhere), copies its output to the log, enforces the time limit (TERM, grace, KILL), beats a
heartbeat, records the exit status, releases the claim, and starts queued jobs that now fit on
this node. The laptop may be closed the whole time. Standard library only, Python 3.9.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.model import JobKind
from gpuclaim.core.states import JobState
from gpuclaim.node.rank_record import RankRecord
from gpuclaim.node.workenv import ShellRun, job_environment

if TYPE_CHECKING:
    from gpuclaim.core.protocol import WrapperSpec

POLL_S = 0.5
DRAIN_S = 0.2  # after the job ended: how long its output may still take to arrive
PLACEMENT_FRESH_S = 10.0  # a placement probe this recent stands for the wrapper's own


class Wrapper(RankRecord):
    """Runs one rank of a job from its spec file to the recorded end: the process, its
    environment, its output and its time limit (what it records: ``RankRecord``)."""

    def __init__(self, spec: WrapperSpec, shell: Optional[ShellRun] = None) -> None:
        super().__init__(spec)
        self.shell = shell  # the login shell, started before the rest was imported

    def run(self) -> int:
        signal.signal(signal.SIGHUP, self._on_hangup)
        signal.signal(signal.SIGTERM, self._on_hangup)
        log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the job
        try:
            self._beat()
            env, error = self._environment()
            if error:
                log.write(f"gpuclaim: {error}\n".encode())
                return self._finish(JobState.FAILED, None, error)
            return self._supervise(env, log)
        except Exception as exc:  # the claim must be released whatever went wrong
            log.write(f"gpuclaim: wrapper error: {exc}\n".encode())
            return self._finish(JobState.FAILED, None, f"wrapper error: {exc}")
        finally:
            if self.shell is not None:
                self.shell.stop()  # not needed after all, if it was not read
            log.close()

    def _on_hangup(self, signum: int, frame: Any) -> None:
        # The tmux session or server went away: stop the job rather than leave it unmanaged.
        self.stop_reason = self.stop_reason or JobState.KILLED

    def _environment(self) -> tuple[dict[str, str], Optional[str]]:
        try:
            self._check_workdir(self.run_dir)  # first: a relative venv is the workdir's
        except GpuclaimError as exc:
            return {}, exc.message
        node_env = dict(self.spec["node_env"])
        index_of = self._placed_indices()
        if index_of is None:  # placed long ago (a queued job): look again
            from gpuclaim.node.probe.local import probe_local

            inventory = probe_local(
                self.me.node,
                tuple(self.spec["nvidia_smi"]),
                node_env,
                float(self.spec["probe_timeout"]),
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
        workenv = self.spec["workenv"]
        try:
            env = job_environment(
                dict(os.environ),
                self.me.node,
                login=bool(workenv["login_shell"]),
                venv=workenv["venv"],
                conda=workenv["conda"],
                workdir=self.run_dir,
                shell=self.shell,
            )
        except GpuclaimError as exc:
            return {}, exc.message
        env["PWD"] = self.run_dir
        env.update(node_env)
        env.update(dict(self.job.env))
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": visible,
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",  # indices as nvidia-smi numbers them
                "GPUCLAIM_JOB": self.job.name,
                "GPUCLAIM_JOB_ID": self.job.id,
                "GPUCLAIM_RESTART_COUNT": str(self.job.restarts),
            }
        )
        if self.job.preemptible:
            env["GPUCLAIM_PREEMPT_GRACE"] = f"{float(self.spec['preempt_grace_s']):g}"
            env["GPUCLAIM_PREEMPT_DEADLINE"] = str(self.deadline_path)
        env.update({k: str(v) for k, v in self.spec["gang"].items()})
        return env, None

    def _placed_indices(self) -> Optional[dict[str, int]]:
        """The GPUs' indices as the placement probe saw them, if that was moments ago."""
        placed = self.spec["placed"]
        indices = placed["indices"]
        if set(indices) != set(self.me.gpu_uuids):
            return None
        try:
            fresh = abs(self.store.now() - float(placed["at"])) < PLACEMENT_FRESH_S
        except (GpuclaimError, KeyError, TypeError, ValueError):
            return None
        return {str(u): int(i) for u, i in indices.items()} if fresh else None

    def _resolve_argv(self, env: dict[str, str]) -> list[str]:
        """Interactive kinds are resolved here, on the node: its shell, its jupyter."""
        if self.job.kind == JobKind.SHELL:
            return [os.environ.get("SHELL") or "/bin/bash", "-l"]
        if self.job.kind == JobKind.NOTEBOOK:
            import shutil

            from gpuclaim.node.runner import free_port  # only here: a job's start skips them

            jupyter = shutil.which("jupyter", path=env.get("PATH"))
            if jupyter is None:
                raise GpuclaimError(
                    "jupyter is not installed on this node (pip install jupyterlab there)"
                )
            port = free_port()
            self.store.update_job(job_id=self.job.id, changes={"port": port})
            return [jupyter, "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}"]
        return list(self.job.argv)

    @property
    def deadline_path(self) -> Path:
        """Written when the job is asked to yield: when its grace ends (epoch seconds)."""
        return self.log_path.with_name(self.log_path.name + ".preempt-deadline")

    def _begin_yielding(self, log: Any) -> float:
        """Preempted: tell the job by when (the file), send its signal; the grace left."""
        deadline = self.job.preempt_deadline
        try:
            left = max(0.0, deadline - self.store.now()) if deadline is not None else 0.0
        except GpuclaimError:
            left = float(self.spec["preempt_grace_s"])
        try:
            self.deadline_path.write_text(f"{time.time() + left:.3f}\n", encoding="utf-8")
        except OSError:
            pass  # the signal still says it
        name = self.job.preempt_signal
        sig = getattr(signal, f"SIG{name}", None) or signal.SIGUSR1
        by = self.job.preempted_by or "someone"
        log.write(
            f"\ngpuclaim: preempted (its GPUs go to {by}): SIG{name} now, "
            f"SIGTERM in {left:.0f}s unless it ends\n".encode()
        )
        self._signal(sig)
        return left

    @property
    def run_dir(self) -> str:
        """Where the command runs: as the launch decided (``runner.resolve_workdir``)."""
        decided = self.spec["run_dir"]
        if decided:
            return str(decided)
        return str(Path(self.job.workdir).expanduser()) if self.job.workdir else str(Path.home())

    def _supervise(self, env: dict[str, str], log: Any) -> int:
        started = self.store.now()
        deadline = time.monotonic() + self.job.time_limit_s
        cwd = self.run_dir  # checked by _environment, before the login shell ran
        try:
            argv = self._resolve_argv(env)
        except GpuclaimError as exc:
            log.write(f"gpuclaim: {exc}\n".encode())
            return self._finish(JobState.FAILED, None, str(exc))
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
            return self._finish(JobState.FAILED, code, message)
        # The output goes to the log from its first byte, in a thread of its own: a follower
        # sees the job's first line without waiting for the store (recording the start
        # writes the job's record and an event: on NFS, many ms).
        pump = None
        if self.child.stdout is not None:
            pump = threading.Thread(target=self._pump, args=(self.child.stdout, log), daemon=True)
            pump.start()
        self._record_start(started)
        next_beat = time.monotonic() + self.beat_s
        next_sample = time.monotonic() + self.sample_s
        next_check = time.monotonic() + 1.0
        stop_sent: Optional[float] = None
        yield_until: Optional[float] = None  # preempted: the end of its grace
        while True:
            try:
                self.child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if self.stop_reason is None and now > deadline:
                self.stop_reason = JobState.TIMEOUT
            if now > next_check:
                # a preemptible job checks twice as often: a claim waits for it to yield
                next_check = now + (0.5 if self.job.preemptible else 1.0)
                self._check_stop_request()
            if self.stop_reason == JobState.PREEMPTED and yield_until is None:
                yield_until = now + self._begin_yielding(log)
            if self.stop_reason is not None and (yield_until is None or now >= yield_until):
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
        if pump is not None:
            pump.join(DRAIN_S)  # what it wrote last (a leftover may hold the pipe open)
        self._signal(signal.SIGKILL)  # leftovers of the job's process group hold GPU memory
        if pump is not None:
            pump.join(DRAIN_S)  # the pipe closed with them: its last bytes, then the end
        return self._record_end(self.child.returncode)

    def _record_end(self, code: int) -> int:
        """How the run ended, from its status and why it was stopped (if it was)."""
        exit_code = code if code >= 0 else 128 - code
        if self.stop_reason == JobState.TIMEOUT:
            return self._finish(JobState.TIMEOUT, exit_code, "time limit reached")
        if self.stop_reason == JobState.PREEMPTED:
            by = self.job.preempted_by or "someone"
            return self._finish(JobState.PREEMPTED, exit_code, f"yielded its GPUs to {by}")
        if self.stop_reason is not None:
            reason = self.job.stop_requested or JobState.KILLED.value
            return self._finish(JobState.KILLED, exit_code, reason)
        if code == 0:
            return self._finish(JobState.SUCCEEDED, 0, "")
        return self._finish(JobState.FAILED, exit_code, f"exit status {exit_code}")

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

    def _pump(self, out: Any, log: Any) -> None:
        """Copy the job's output to its log and to the tmux pane (``gpuclaim attach``) as it
        comes, until the pipe closes (the job and what it started ended) or the log does.
        It never stops reading while the job runs: a full pipe would block the job."""
        fd = out.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return
            if not data:
                return
            try:
                log.write(data)
            except ValueError:
                return  # the log was closed: the wrapper is done with this job
            except OSError:
                pass  # a full disk loses output, not the job
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except OSError:
                pass

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


def run_wrapper(spec_path: str) -> int:
    spec: WrapperSpec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    # The user's profile runs while the wrapper imports what it records the job with.
    workenv = spec["workenv"]
    login, conda = bool(workenv["login_shell"]), str(workenv["conda"] or "")
    shell = ShellRun.start(dict(os.environ), login, conda) if login or conda else None
    return Wrapper(spec, shell).run()
