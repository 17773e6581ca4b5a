"""A job's command as its wrapper runs it: started, watched (its time limit, stop requests,
preemption's signal and grace, a service's health), and reaped, its output copied to the log
and the tmux pane as it comes. Standard library only, Python 3.9.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Protocol

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.states import JobState
from gpuclaim.node.rank_record import RankRecord

if TYPE_CHECKING:
    from gpuclaim.core.protocol import WrapperSpec


class HealthStep(Protocol):
    """A service's health check, asked at each turn of the watch (``keep_up.HealthWatch``)."""

    def step(self, now: float) -> Optional[str]: ...


POLL_S = 0.5
DRAIN_S = 0.2  # after the job ended: how long its output may still take to arrive


class ChildRun(RankRecord):
    """One rank's command: the process, its output, how it is stopped and how it ended."""

    def __init__(self, spec: WrapperSpec) -> None:
        super().__init__(spec)
        self.pump: Optional[threading.Thread] = None  # copies the command's output to the log

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

    def _start_child(
        self, argv: list[str], env: dict[str, str], log: Any
    ) -> Optional[tuple[str, Optional[int]]]:
        """Start the command; (message, exit code) if it could not start."""
        cwd = self.run_dir  # checked by _environment, before the login shell ran
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
            return message, code
        # The output goes to the log from its first byte, in a thread of its own: a follower
        # sees the job's first line without waiting for the store (recording the start
        # writes the job's record and an event: on NFS, many ms).
        self.pump = None
        if self.child.stdout is not None:
            self.pump = threading.Thread(
                target=self._pump, args=(self.child.stdout, log), daemon=True
            )
            self.pump.start()
        return None

    def _watch(self, log: Any, deadline: float, health: Optional[HealthStep] = None) -> bool:
        """Until the command ends: its time limit, stop requests (kill, preemption), the
        heartbeat, usage samples, and a service's health. True: the health check asks for
        a restart (the command was stopped for it)."""
        assert self.child is not None
        next_beat = time.monotonic() + self.beat_s
        next_sample = time.monotonic() + self.sample_s
        next_check = time.monotonic() + 1.0
        stop_sent: Optional[float] = None
        yield_until: Optional[float] = None  # preempted: the end of its grace
        restart: Optional[str] = None  # why the health check restarts it
        while True:
            try:
                self.child.wait(timeout=POLL_S)
                return restart is not None
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if self.stop_reason is None and now > deadline + self.extended_s:
                self.stop_reason = JobState.TIMEOUT
            if now > next_check:
                # a preemptible job checks twice as often: a claim waits for it to yield
                next_check = now + (0.5 if self.job.preemptible else 1.0)
                self._check_stop_request()
            if self.stop_reason == JobState.PREEMPTED and yield_until is None:
                yield_until = now + self._begin_yielding(log)
            if health is not None and restart is None and self.stop_reason is None:
                restart = health.step(now)
                if restart is not None:
                    log.write(f"\ngpuclaim: {restart}: restarting it (SIGTERM)\n".encode())
            stopping = self.stop_reason is not None or restart is not None
            if stopping and (yield_until is None or now >= yield_until):
                if stop_sent is None:
                    stop_sent = now
                    if restart is None:
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

    def _reap_child(self) -> int:
        """The ended command's status, once its output is in the log and nothing of its
        process group is left."""
        assert self.child is not None
        if self.pump is not None:
            self.pump.join(DRAIN_S)  # what it wrote last (a leftover may hold the pipe open)
        self._signal(signal.SIGKILL)  # leftovers of the job's process group hold GPU memory
        if self.job.ray:  # a Ray node's processes, wherever they went (its supervisor killed)
            from gpuclaim.node.ray_ports import kill_marked

            kill_marked(f"{self.job.id}-{self.rank}")
        if self.pump is not None:
            self.pump.join(DRAIN_S)  # the pipe closed with them: its last bytes, then the end
        return int(self.child.returncode)

    def _record_end(self, code: int) -> int:
        """How the run ended, from its status and why it was stopped (if it was)."""
        exit_code = code if code >= 0 else 128 - code
        if self.stop_reason == JobState.TIMEOUT:
            return self._finish(JobState.TIMEOUT, exit_code, "time limit reached")
        if self.stop_reason == JobState.PREEMPTED:
            by = self.job.preempted_by or "someone"
            return self._finish(JobState.PREEMPTED, exit_code, f"yielded its GPUs to {by}")
        if self.stop_reason is not None:
            return self._finish(JobState.KILLED, exit_code, self.kill_reason())
        if code == 0:
            return self._finish(JobState.SUCCEEDED, 0, "")
        return self._finish(JobState.FAILED, exit_code, f"exit status {exit_code}")

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
