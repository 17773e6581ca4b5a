"""The job wrapper: runs inside a rank's tmux session and owns the job's life.

It pins the GPUs (checked by UUID), runs the command with its argv untouched (no shell
anywhere), copies its output to the log, enforces the time limit (TERM, grace, KILL), beats a
heartbeat, records the exit status, releases the claim, and starts queued jobs that now fit on
this node. The laptop may be closed the whole time. Standard library only, Python 3.9.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.model import JobKind
from gpuclaim.core.states import JobState
from gpuclaim.node.child import ChildRun
from gpuclaim.node.workenv import ShellRun, job_environment

if TYPE_CHECKING:
    from gpuclaim.core.protocol import WrapperSpec

PLACEMENT_FRESH_S = 10.0  # a placement probe this recent stands for the wrapper's own


class Wrapper(ChildRun):
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
            refused = self._refused()
            if refused:
                log.write(f"gpuclaim: refused to run this job: {refused}\n".encode())
                return self._finish(JobState.FAILED, None, f"refused: {refused}")
            env, error = self._environment()
            if error:
                log.write(f"gpuclaim: {error}\n".encode())
                return self._finish(JobState.FAILED, None, error)
            for note in self.share_notes:
                log.write(f"gpuclaim: {note}\n".encode())
            return self._supervise(env, log)
        except Exception as exc:  # the claim must be released whatever went wrong
            log.write(f"gpuclaim: wrapper error: {exc}\n".encode())
            return self._finish(JobState.FAILED, None, f"wrapper error: {exc}")
        finally:
            if self.shell is not None:
                self.shell.stop()  # not needed after all, if it was not read
            log.close()

    def _refused(self) -> str:
        """Why this account must not run the job ("" when it may): the last gate, whoever
        launched it. Only a spec file of this account, written by nobody else, vouches for
        what runs (``store/owners.py``); a refusal is logged for ``doctor``."""
        why = self.store.check_job(job=self.job)
        if why:
            from dataclasses import replace

            from gpuclaim.core.accounts import this_account
            from gpuclaim.core.events import job_event
            from gpuclaim.core.model import EventType

            me = this_account()
            more = {"account": self.job.account, "uid": self.job.uid, "why": why}
            event = job_event(EventType.REFUSED, self.job, self.store.now(), more)
            self.store.append_event(replace(event, by=me.name))
        return why

    def _on_hangup(self, signum: int, frame: Any) -> None:
        # The tmux session or server went away: stop the job rather than leave it unmanaged
        # (its record says why: ``kill_reason``).
        self.stop_reason = self.stop_reason or JobState.KILLED
        self.hangup = self.hangup or signum

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
        else:  # a MIG slice only by its UUID: CUDA has no index for it
            visible = ",".join(
                u if u.startswith("MIG-") else str(index_of[u]) for u in self.me.gpu_uuids
            )
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
        if self.job.service is not None:
            env["GPUCLAIM_PORT"] = str(self.job.service.port)
        if self.job.preemptible:
            env["GPUCLAIM_PREEMPT_GRACE"] = f"{float(self.spec['preempt_grace_s']):g}"
            env["GPUCLAIM_PREEMPT_DEADLINE"] = str(self.deadline_path)
        env.update({k: str(v) for k, v in self.spec["gang"].items()})
        if self.me.mem_mib:  # a share of its GPU: told its size, capped where the node can
            from gpuclaim.node.share_env import share_environment

            told, self.share_notes = share_environment(
                self.me.mem_mib,
                self.me.mem_total_mib,
                self.job.id,
                self.share_policy.preload,
                dict(self.job.env),
            )
            env.update(told)
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
        if self.job.ray:
            from gpuclaim.node.ray_node import supervisor_argv

            token = str(self.spec.get("ray_token") or "")
            if token:  # in the environment, never on a command line others can read
                env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})

            return supervisor_argv(
                {
                    "job_id": self.job.id,
                    "rank": self.rank,
                    "nnodes": len(self.job.ranks),
                    "node": self.me.node,
                    "num_gpus": len(self.me.gpu_uuids),
                    "num_cpus": self.job.ray_cpus,
                    "store_root": self.spec["store_root"],
                    "argv": list(self.job.argv),
                }
            )
        return list(self.job.argv)

    def _supervise(self, env: dict[str, str], log: Any) -> int:
        started = self.store.now()
        # A service started again after a reboot keeps its first start's time limit.
        ends = self.job.ends
        left = self.job.time_limit_s if ends is None else max(0.0, ends - started)
        deadline = time.monotonic() + left
        try:
            argv = self._resolve_argv(env)
        except GpuclaimError as exc:
            log.write(f"gpuclaim: {exc}\n".encode())
            return self._finish(JobState.FAILED, None, str(exc))
        if self.spec.get("revived"):
            log.write(f"gpuclaim: started again ({self.spec['revived']})\n".encode())
        failed = self._start_child(argv, env, log)
        if failed is not None:
            message, code = failed
            return self._finish(JobState.FAILED, code, message)
        self._record_start(started)
        if self.job.service is not None:
            from gpuclaim.node.keep_up import keep_up

            return keep_up(self, argv, env, log, deadline)
        self._watch(log, deadline)
        return self._record_end(self._reap_child())

    def _check_workdir(self, cwd: str) -> None:
        """Say which path is missing, and where: not ``cannot start 'python3'``."""
        if not Path(cwd).is_dir():
            what = "is not a directory" if Path(cwd).exists() else "does not exist"
            raise GpuclaimError(f"workdir {cwd} {what} on {self.me.node}")


def run_wrapper(spec_path: str) -> int:
    spec: WrapperSpec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    # The user's profile runs while the wrapper imports what it records the job with.
    workenv = spec["workenv"]
    login, conda = bool(workenv["login_shell"]), str(workenv["conda"] or "")
    shell = ShellRun.login(dict(os.environ), login, conda) if login or conda else None
    return Wrapper(spec, shell).run()
