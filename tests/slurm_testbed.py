#!/usr/bin/env python3
"""A real SLURM on this machine (munged, slurmctld, one slurmd per node) running exported
configuration files: see ../../shared/slurm-testbed.md for the recipe and its pitfalls.

    tb = SlurmTestbed.up(export_dir, gpus={"node01": ["NVIDIA H100 80GB HBM3"] * 2}, root=tmp)
    job = tb.sbatch(script, cwd)        # job id
    tb.wait(job)                        # scontrol's fields once it ended
    tb.down()

The exported files run as they are, except for what a CI container cannot have and a site
sets anyway (see _overrides): paths, ports, users, munge's socket, cgroups, and slurmdbd with
what needs it (the GPU TRES and GPU billing weights). Every node is one slurmd on this host
(``slurmd -N NODE``, its own port, NodeAddr 127.0.0.1). The GPUs are faked twice over:
character devices under the temp dir stand in for /dev/nvidiaN, and a ``fake_gpus.conf``
(slurmd's own test hook) makes slurmd "detect" GPUs with the type names NVML would report, so
gres.conf's Type= values go through slurmd's real AutoDetect matching. The cluster is proven
only if every node comes up idle with exactly the Gres slurm.conf gives it and slurmd ignored
no detected GPU; anything less raises.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PACKAGES = "slurmctld slurmd slurm-client munge"
TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
READY_TIMEOUT_S = 20.0
PARTITION_DROPPED = ("XXXX=",)  # billing by GPU needs slurmdbd (see _overrides)


class SlurmTestbedError(RuntimeError):
    """SLURM refused the configuration or did not come up; the message says why."""


class MissingSlurm(SlurmTestbedError):
    """SLURM or munge is not installed."""


def _overrides(t: Path, munge: Path, ctld_port: int) -> dict[str, Optional[str]]:
    user = _user()
    return {
        "SlurmctldHost": f"{socket.gethostname().split('.')[0]}(127.0.0.1)",
        "SlurmctldPort": str(ctld_port),
        "SlurmUser": user,
        "SlurmdUser": user,
        "AuthInfo": f"socket={munge}/munge.socket",
        "StateSaveLocation": f"{t}/state",
        "SlurmdSpoolDir": f"{t}/spool/%n",
        "SlurmctldPidFile": f"{t}/run/slurmctld.pid",
        "SlurmdPidFile": f"{t}/run/slurmd-%n.pid",
        "SlurmctldLogFile": f"{t}/log/slurmctld.log",
        "SlurmdLogFile": f"{t}/log/slurmd-%n.log",
        "SlurmdDebug": "debug",
        "MailProg": "/bin/true",
        # No cgroups in a CI container (slurmctld still parses cgroup.conf).
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        # No slurmdbd either. Without one, slurmctld is fatal on a GPU TRES, and GPU billing
        # weights need that TRES (and with slurmdbd configured but not there, it is fatal too).
        "AccountingStorageType": "accounting_storage/none",
        # Jobs start as soon as they are submitted, not on the next 3 s tick.
        "SchedulerParameters": "batch_sched_delay=0",
    }


@dataclass
class SlurmTestbed:
    root: Path
    munge: Path  # munged's key and socket
    nodes: dict[str, str]  # node -> its expected Gres, as slurm.conf says
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def ctl_conf(self) -> Path:
        return self.root / "etc" / "ctl" / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.ctl_conf)}

    def run(self, *argv: str, check: bool = True, cwd: Optional[Path] = None) -> str:
        proc = subprocess.run(
            argv, env=self.env(), capture_output=True, text=True, timeout=30, cwd=cwd
        )
        if check and proc.returncode != 0:
            raise SlurmTestbedError(
                f"{' '.join(argv)} -> {proc.returncode}: {proc.stderr.strip()}\n{self.logs()}"
            )
        return proc.stdout + proc.stderr

    # -- starting ------------------------------------------------------------------------------
    @classmethod
    def up(cls, export_dir: Path, gpus: dict[str, list[str]], root: Path) -> SlurmTestbed:
        """Run SLURM with ``export_dir``'s files; ``gpus`` are each node's GPU product names
        (as NVML would report them), in device order."""
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            raise MissingSlurm(
                f"{', '.join(missing)} not found: install SLURM and munge with "
                f"`apt-get install --no-install-recommends {PACKAGES}`"
            )
        for sub in ("etc/ctl", "state", "spool", "log", "run", "dev"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        # munged wants every directory above its socket o+x, which pytest's tmp dirs are not.
        munge = Path(tempfile.mkdtemp(prefix="gpuclaim-munge-"))
        os.chmod(munge, 0o755)
        tb = cls(root, munge, {})
        try:
            tb._start(export_dir, gpus)
        except BaseException:
            tb.down()
            raise
        return tb

    def _start(self, export_dir: Path, gpus: dict[str, list[str]]) -> None:
        t = self.root
        self._start_munge()
        ctld_port, *node_ports = _free_ports(1 + len(gpus))
        conf = (export_dir / "slurm.conf").read_text()
        conf, self.nodes = self._rewrite_slurm_conf(
            conf, _overrides(t, self.munge, ctld_port), node_ports
        )
        unknown = set(self.nodes) ^ set(gpus)
        if unknown:
            raise SlurmTestbedError(f"slurm.conf's nodes and the test's differ: {unknown}")
        gres = (export_dir / "gres.conf").read_text().replace("/dev/nvidia", f"{t}/dev/nvidia")
        for n in range(max(len(g) for g in gpus.values())):
            _fake_device(t / "dev" / f"nvidia{n}", n)
        cpus = os.cpu_count() or 1
        for name in ["ctl", *gpus]:
            d = t / "etc" / name
            d.mkdir(exist_ok=True)
            (t / "spool" / name).mkdir(exist_ok=True)
            (d / "slurm.conf").write_text(conf)
            (d / "gres.conf").write_text(gres)
            shutil.copy(export_dir / "cgroup.conf", d / "cgroup.conf")
            if name != "ctl":  # what NVML would report on that node: type names as Slurm makes them
                (d / "fake_gpus.conf").write_text(
                    "".join(
                        f"{product.lower().replace(' ', '_')}|{cpus}|0-{cpus - 1}|(null)|"
                        f"{t}/dev/nvidia{i}|(null)|nvidia_gpu_env\n"
                        for i, product in enumerate(gpus[name])
                    )
                )
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"], self.ctl_conf)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "UP" not in self.run("scontrol", "ping", check=False):
            self._alive_or_fail(deadline)
        for name in gpus:
            self._spawn(
                f"slurmd-{name}", ["slurmd", "-D", "-N", name], t / "etc" / name / "slurm.conf"
            )
        self._wait_idle(deadline)
        self._check_gres()

    def _start_munge(self) -> None:
        m = self.munge
        subprocess.run(["mungekey", "-c", "-k", str(m / "munge.key")], check=True)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "-S",
                str(m / "munge.socket"),
                f"--key-file={m}/munge.key",
                f"--pid-file={m}/munged.pid",
                f"--seed-file={m}/munged.seed",
            ],
            None,
        )
        deadline = time.monotonic() + 5
        while not (m / "munge.socket").exists():  # before it: "Failed to access munge.socket"
            self._alive_or_fail(deadline)

    def _spawn(self, name: str, argv: list[str], conf: Optional[Path]) -> None:
        env = {**os.environ, **({"SLURM_CONF": str(conf)} if conf else {})}
        # A file, never a pipe: a daemon's output would fill it and block.
        with open(self.root / "log" / f"{name}.stdout", "wb") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc.name = name  # type: ignore[attr-defined]
        self.procs.append(proc)

    def _rewrite_slurm_conf(
        self, text: str, overrides: dict[str, Optional[str]], ports: list[int]
    ) -> tuple[str, dict[str, str]]:
        """Site settings replaced (None: removed), each node mapped to this host on its own
        port."""
        lines, seen, gres = [], set(), {}
        for line in text.splitlines():
            key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("#") else ""
            if key == "NodeName":
                fields = dict(f.split("=", 1) for f in line.split())
                names = self.expand(fields["NodeName"])
                start = ports[len(gres)]
                for n in names:
                    gres[n] = fields.get("Gres", "(null)")
                fields.update(
                    NodeAddr="127.0.0.1",
                    NodeHostname=socket.gethostname().split(".")[0],
                    Port=f"[{start}-{start + len(names) - 1}]" if len(names) > 1 else str(start),
                )
                line = " ".join(f"{k}={v}" for k, v in fields.items())
            elif key == "PartitionName":
                line = " ".join(f for f in line.split() if not f.startswith(PARTITION_DROPPED))
            elif key in overrides:
                seen.add(key)
                if overrides[key] is None:
                    continue
                line = f"{key}={overrides[key]}"
            lines.append(line)
        lines += [f"{k}={v}" for k, v in overrides.items() if k not in seen and v is not None]
        return "\n".join(lines) + "\n", gres

    def expand(self, hostlist: str) -> list[str]:
        """SLURM's own reading of a host list (``node[01-03]``), without a running cluster."""
        stub = self.root / "etc" / "hostlist.conf"
        stub.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
        proc = subprocess.run(
            ["scontrol", "show", "hostnames", hostlist],
            env={**os.environ, "SLURM_CONF": str(stub)},
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        return proc.stdout.split()

    def _wait_idle(self, deadline: float) -> None:
        while True:
            states = dict(
                line.split()[:2]
                for line in self.run("sinfo", "-h", "-N", "-o", "%N %T").splitlines()
                if line.strip()
            )
            if set(states) == set(self.nodes) and all(s == "idle" for s in states.values()):
                return
            bad = {n: s for n, s in states.items() if s.rstrip("*") in ("inval", "drained")}
            if bad:
                reasons = self.run("sinfo", "-R", "-h", "-o", "%N: %E")
                raise SlurmTestbedError(f"nodes refused their config {bad}: {reasons}")
            self._alive_or_fail(deadline, f"nodes not idle: {states}")

    def _check_gres(self) -> None:
        """The silent failures: no GresTypes (Gres null), a type that differs in case, a GPU
        slurmd detected but could not match to a gres.conf line."""
        for node, want in self.nodes.items():
            fields = dict(
                f.split("=", 1)
                for f in self.run("scontrol", "-o", "show", "node", node).split()
                if "=" in f
            )
            have = re.sub(r"\(S:[^)]*\)", "", fields.get("Gres", ""))  # socket affinity
            if have != want:
                raise SlurmTestbedError(f"{node}: Gres is {have}, slurm.conf says {want}")
        for log in sorted((self.root / "log").glob("slurmd-*.log")):
            text = log.read_text(errors="replace")
            for problem in ("autodetected GPUs are being ignored", "fatal:"):
                if problem in text:
                    after = text[text.index(problem) :].splitlines()[:6]
                    raise SlurmTestbedError(f"{log.name}: " + "\n".join(after))

    def _alive_or_fail(self, deadline: float, what: str = "SLURM did not come up") -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise SlurmTestbedError(f"{p.name} exited with {p.returncode}\n{self.logs()}")  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise SlurmTestbedError(f"{what} within {READY_TIMEOUT_S:.0f}s\n{self.logs()}")
        time.sleep(0.05)

    # -- jobs ------------------------------------------------------------------------------------
    def sbatch(self, script: Path, cwd: Path) -> int:
        out = self.run("sbatch", "--parsable", str(script), cwd=cwd)
        return int(out.strip().split(";")[0])

    def wait(self, job_id: int, timeout: float = 30.0) -> dict[str, str]:
        """scontrol's fields of the job once it ended (sbatch --wait polls only every 10 s)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.run("scontrol", "-o", "show", "job", str(job_id))
            fields = dict(f.split("=", 1) for f in text.split() if "=" in f)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return fields
            if time.monotonic() > deadline:
                raise SlurmTestbedError(f"job {job_id} still {fields.get('JobState')}\n{text}")
            time.sleep(0.1)

    # -- stopping ------------------------------------------------------------------------------
    def down(self) -> None:
        """Stop the daemons we started, by PID: slurmd first, munged last."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()
        shutil.rmtree(self.munge, ignore_errors=True)

    def logs(self) -> str:
        parts = []
        for log in sorted((self.root / "log").iterdir()):
            text = log.read_text(errors="replace")
            if text.strip():
                parts.append(f"--- {log.name}\n{_tail(text)}")
        return "\n".join(parts)


def _fake_device(path: Path, minor: int) -> None:
    """A character device like /dev/nvidiaN (a plain file gives jobs no CUDA_VISIBLE_DEVICES);
    a link to /dev/null where mknod is not allowed."""
    if path.exists() or path.is_symlink():
        return
    try:
        os.mknod(path, 0o666 | 0o020000, os.makedev(195, minor))
    except PermissionError:
        path.symlink_to("/dev/null")


def _free_ports(n: int) -> list[int]:
    """``n`` ports for slurmctld and the slurmds; consecutive runs are what a node range's
    Port=[a-b] needs, so they come from one block that was free a moment ago."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65000:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return list(range(base, base + n))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SlurmTestbedError("no block of free ports")


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])
