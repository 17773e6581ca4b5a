"""Following a job's log from the terminal (``run --follow``, ``logs -f``): its output as it
comes, then one line of how it ended, and its exit code."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.cli.common import AppState
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.states import JobState, started

if TYPE_CHECKING:
    from gpuclaim.core.protocol import ReadLogResponse

FOLLOW_POLL_S = 0.5
LOOK_EVERY_S = 5.0  # how often a follower checks the job's heartbeat (a node that rebooted)


class FirstRead:
    """The follower's first read of a job's log, sent while the CLI still says where the job
    started (that line costs ~20 ms of rich's import): the job's first line is not held up
    behind it. ``take`` gives the answer, or raises what the read raised."""

    def __init__(self, st: AppState) -> None:
        self.st = st
        self._thread: Optional[threading.Thread] = None
        self._answer: Optional[ReadLogResponse] = None
        self._error: Optional[BaseException] = None
        self.for_log = ""

    def start(self, job: Any) -> None:
        running = started(job.state)
        if not running or not job.ranks or not job.ranks[0].log:
            return
        rank = job.ranks[0]
        self.for_log = rank.log
        node = self.st.config.node(rank.node)
        self._thread = threading.Thread(target=self._read, args=(node, rank.log), daemon=True)
        self._thread.start()

    def _read(self, node: Any, log: str) -> None:
        try:
            self._answer = self.st.ops.read_log(node, log, offset=0, wait_s=FOLLOW_POLL_S)
        except BaseException as exc:  # handed to the follower, in its own thread
            self._error = exc

    def take(self, log: str, offset: int) -> Optional[ReadLogResponse]:
        """The first read's answer if it was for ``log`` from ``offset`` 0; None if none ran."""
        if self._thread is None or log != self.for_log or offset != 0:
            return None
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error
        return self._answer


def follow_log(
    st: AppState,
    job: Any,
    rank: int,
    offset: int,
    quiet: bool = False,
    first: Optional[FirstRead] = None,
) -> int:
    """Print rank ``rank``'s log from ``offset`` until the job ends, then one line on stderr
    of how it ended; returns the exit code for it (``exit_code_of``). A preemptible
    ``--requeue`` job that yielded is followed into its rerun (said on stderr), and the
    exit code is the last run's."""
    from gpuclaim.engine.job_watch import exit_code_of, outcome_line

    try:
        job = _follow_run(st, job, rank, offset, first)
        while job.state == JobState.PREEMPTED:
            job = _requeued(st, job)
            if not job.requeued_as:
                break  # not to be requeued: its end is this run's
            job = _rerun_started(st, job, quiet)
            if job is None or rank >= len(job.ranks) or not job.ranks[rank].log:
                break  # gone, or ended without running (cancelled): nothing to follow
            job = _follow_run(st, job, rank, 0, None)
    except _Stopped as stop:
        sys.stderr.write(
            f"\ngpuclaim: stopped following; job {stop.name} goes on "
            f"(gpuclaim kill {stop.name} stops it)\n"
        )
        return 130
    if job is None:
        return 1
    if not quiet:
        flush_stdout()
        sys.stderr.write(f"gpuclaim: {outcome_line(job, time.time())}\n")
    return exit_code_of(job)


class _Stopped(Exception):
    """Ctrl-C while following: the job goes on."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


REQUEUE_WAIT_S = 10.0  # a preempted --requeue run names its rerun moments after its end


def _requeued(st: AppState, job: Any) -> Any:
    """A preempted ``--requeue`` job once its record names its rerun (its end is written
    first, the rerun a moment later); as it is if it was not to be requeued."""
    from gpuclaim.engine.job_records import reload_job

    deadline = time.monotonic() + REQUEUE_WAIT_S
    try:
        while job.requeue and not job.requeued_as and time.monotonic() < deadline:
            time.sleep(0.1)
            job = reload_job(st.store, job)
    except KeyboardInterrupt:
        raise _Stopped(job.name) from None
    return job


def _rerun_started(st: AppState, job: Any, quiet: bool) -> Optional[Any]:
    """The rerun of a requeued job once it started (or ended without starting); None if its
    record is gone. Said on stderr, as it waits in the queue."""
    from gpuclaim.core.states import ended
    from gpuclaim.engine.job_records import find_job

    if not quiet:
        sys.stderr.write(
            f"gpuclaim: job {job.name} yielded its GPUs and went back to the queue; "
            "following its next run\n"
        )
    rerun_id = job.requeued_as
    try:
        while True:
            try:
                rerun = find_job(st.store, job.user, rerun_id, active_only=False)
            except GpuclaimError:
                return None
            ran = bool(rerun.ranks and rerun.ranks[0].log)  # launched: it has a log to show
            if (started(rerun.state) and ran) or ended(rerun.state):
                return rerun
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        raise _Stopped(job.name) from None


def _follow_run(st: AppState, job: Any, rank: int, offset: int, first: Optional[FirstRead]) -> Any:
    """One run's log from ``offset`` until that run ended; the job as it ended."""
    from gpuclaim.core.errors import UnreachableError
    from gpuclaim.core.states import ended
    from gpuclaim.engine.job_records import observed_state, reload_job

    r = job.ranks[rank]
    node = st.config.node(r.node)
    next_look = time.monotonic() + LOOK_EVERY_S
    try:
        while True:
            job = reload_job(st.store, job)
            final = ended(job.state)
            if not final and time.monotonic() >= next_look:
                next_look = time.monotonic() + LOOK_EVERY_S
                if observed_state(job, st.store.snapshot().claims) == JobState.LOST:
                    job, final = job.with_(state=JobState.LOST.value), True
            try:
                # the node answers at once when there is output, else waits for the next
                # line; the job's state is read between reads, so its end is seen within
                # FOLLOW_POLL_S, and once it ended the rest is read without waiting
                wait_s = 0.0 if final else FOLLOW_POLL_S
                chunk: Optional[ReadLogResponse] = (
                    first.take(r.log or "", offset) if first is not None else None
                )
                first = None
                if chunk is None:
                    chunk = st.ops.read_log(node, r.log or "", offset=offset, wait_s=wait_s)
            except UnreachableError:
                if final:
                    break  # the rest of the log is on a node we cannot reach now
                # it may come back; heartbeats tell
                chunk = {"data": "", "offset": offset, "size": offset}
                time.sleep(FOLLOW_POLL_S)
            write_out(chunk["data"])
            offset = int(chunk["offset"])
            if final and not chunk["data"]:
                break
    except KeyboardInterrupt:
        raise _Stopped(job.name) from None
    return job


def write_out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except OSError:
        pass
