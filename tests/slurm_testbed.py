#!/usr/bin/env python3
"""A real SLURM on this machine (munged, slurmctld, one slurmd per node) running exported
configuration files: see ../../shared/slurm-testbed.md for the recipe and its pitfalls.

    tb = SlurmTestbed.up(export_dir, gpus={"gpu01": ["NVIDIA H100 80GB HBM3"] * 2}, root=tmp)
    job = tb.sbatch(script, cwd)        # job id
    tb.wait(job)                        # scontrol's fields once it ended
    tb.down()

The exported files run as they are, except for what one test host needs instead of a site's
machines (see _overrides): hosts, ports, paths, users and munge's socket. Every setting the
export chose (cgroups, accounting, priority, billing) stays. Every node is one slurmd on
this host on its own port, reached at 127.0.0.1; as root, each runs in a UTS namespace of
its own whose hostname is the node's, so slurmd finds its line in slurm.conf by `hostname
-s` as on a real node (without root: ``slurmd -N NODE``). The GPUs are faked twice over:
character devices under the temp dir stand in for /dev/nvidiaN, and a ``fake_gpus.conf``
(slurmd's own test hook) makes slurmd "detect" GPUs with the type names NVML would report, so
gres.conf's Type= values go through slurmd's real AutoDetect matching. The cluster is proven
only if every node comes up idle with exactly the Gres slurm.conf gives it and slurmd ignored
no detected GPU; anything less raises.

With ``--accounting slurmdbd`` there is no database to run, so ``without_database`` shows
how far each daemon gets on the exported files: slurmctld and slurmdbd parse them, load
their plugins and stop at the missing database (each says so), where a bad key or value
would have stopped them earlier.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PACKAGES = "slurmctld slurmd slurm-client munge"
TOOLS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo")
READY_TIMEOUT_S = 20.0
# What each daemon says where the files are fine but the database is missing (Slurm 22.05).
CTLD_NO_DATABASE = "You are running with a database but for some reason we have no TRES"
DBD_NO_DATABASE = "The database must be up when starting the MYSQL plugin"


class SlurmTestbedError(RuntimeError):
    """SLURM refused the configuration or did not come up; the message says why."""


class MissingSlurm(SlurmTestbedError):
    """SLURM or munge is not installed."""


def this_host() -> str:
    return socket.gethostname().split(".")[0]


def _overrides(t: Path, munge: Path, ctld_port: int, dbd_port: int) -> dict[str, str]:
    """slurm.conf settings one test host needs: hosts, ports, paths, users, munge's socket;
    test speed and log detail. Nothing the export chose for the cluster's behaviour."""
    user = _user()
    return {
        "SlurmctldHost": f"{this_host()}(127.0.0.1)",
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
        "JobCompLoc": f"{t}/log/jobcomp.log",
        "AccountingStorageHost": "127.0.0.1",
        "AccountingStoragePort": str(dbd_port),
        "SlurmdDebug": "debug",
        "MailProg": "/bin/true",
        # Jobs start as soon as they are submitted, not on the next 3 s tick.
        "SchedulerParameters": "batch_sched_delay=0",
        # slurmd's cgroups are /sys/fs/cgroup/*/slurm_NODE/uid_U/job_ID: two testbeds at once
        # with a node of the same name must not also share job ids.
        "FirstJobId": str(random.randrange(1000, 60_000_000)),
    }


# Overrides of settings that only some exports have: never added where the export has none.
_IF_PRESENT = {"JobCompLoc", "AccountingStorageHost"}


def _dbd_overrides(t: Path, munge: Path, dbd_port: int) -> dict[str, str]:
    """The same for slurmdbd.conf: host, port, user, paths, munge's socket."""
    return {
        "DbdHost": this_host(),
        "DbdPort": str(dbd_port),
        "SlurmUser": _user(),
        "AuthInfo": f"socket={munge}/munge.socket",
        "LogFile": f"{t}/log/slurmdbd.log",
        "PidFile": f"{t}/run/slurmdbd.pid",
    }


@dataclass
class SlurmTestbed:
    root: Path
    munge: Path  # munged's key and socket
    nodes: dict[str, str]  # node -> its expected Gres, as slurm.conf says
    procs: list[subprocess.Popen] = field(default_factory=list)
    # node -> how its slurmd found its line: "hostname" (as on a real node) or "-N"
    found_by: dict[str, str] = field(default_factory=dict)

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
        tb = cls._prepare(root)
        try:
            tb._start(export_dir, gpus)
        except BaseException:
            tb.down()
            raise
        return tb

    @classmethod
    def without_database(cls, export_dir: Path, root: Path) -> dict[str, str]:
        """An export with ``--accounting slurmdbd`` where no database can run: slurmctld on
        its slurm.conf, slurmdbd on its slurmdbd.conf (with the file's own mode), each until
        it stops at the missing database. {daemon: its log}; SlurmTestbedError if one stops
        anywhere else (the log says where) or does not get that far in time."""
        missing = [t for t in ("slurmdbd",) if shutil.which(t) is None]
        if missing:
            raise MissingSlurm(
                "slurmdbd not found: install it with "
                "`apt-get install --no-install-recommends slurmdbd`"
            )
        tb = cls._prepare(root)
        try:
            return tb._no_database(export_dir)
        finally:
            tb.down()

    @classmethod
    def _prepare(cls, root: Path) -> SlurmTestbed:
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
        return cls(root, munge, {})

    def _start(self, export_dir: Path, gpus: dict[str, list[str]]) -> None:
        t = self.root
        self._start_munge()
        ctld_port, dbd_port, *node_ports = _free_ports(2 + len(gpus))
        conf = (export_dir / "slurm.conf").read_text()
        conf, self.nodes, hostnames = self._rewrite_slurm_conf(
            conf, _overrides(t, self.munge, ctld_port, dbd_port), node_ports
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
            node_conf = t / "etc" / name / "slurm.conf"
            if can_rename():
                # A host of its own name: slurmd looks itself up as on the real node.
                argv = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"']
                self._spawn(f"slurmd-{name}", [*argv, hostnames[name], "slurmd", "-D"], node_conf)
                self.found_by[name] = "hostname"
            else:
                self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name], node_conf)
                self.found_by[name] = "-N"
        self._wait_idle(deadline)
        self._check_gres()

    def _no_database(self, export_dir: Path) -> dict[str, str]:
        t = self.root
        self._start_munge()
        text = (export_dir / "slurm.conf").read_text()
        nodes = sum(
            len(self.expand(_key_value(line)))
            for line in text.splitlines()
            if _key(line) == "NodeName"
        )
        ctld_port, dbd_port, *node_ports = _free_ports(2 + nodes)
        conf, _, _ = self._rewrite_slurm_conf(
            text, _overrides(t, self.munge, ctld_port, dbd_port), node_ports
        )
        self.ctl_conf.write_text(conf)
        shutil.copy(export_dir / "gres.conf", self.ctl_conf.parent / "gres.conf")
        shutil.copy(export_dir / "cgroup.conf", self.ctl_conf.parent / "cgroup.conf")
        exported = export_dir / "slurmdbd.conf"
        dbd_conf = self.ctl_conf.parent / "slurmdbd.conf"  # slurmdbd reads it next to slurm.conf
        dbd_conf.write_text(_rewrite(exported.read_text(), _dbd_overrides(t, self.munge, dbd_port)))
        os.chmod(dbd_conf, stat.S_IMODE(exported.stat().st_mode))  # slurmdbd checks it
        logs = {}
        # slurmdbd waits for the database, retrying every 5 s; slurmctld gives up on slurmdbd.
        self._spawn("slurmdbd", ["slurmdbd", "-D"], self.ctl_conf)
        logs["slurmdbd"] = self._until("slurmdbd", DBD_NO_DATABASE, running=True)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"], self.ctl_conf)
        logs["slurmctld"] = self._until("slurmctld", CTLD_NO_DATABASE, running=False)
        return logs

    def _until(self, name: str, said: str, running: bool) -> str:
        """Wait until daemon ``name`` has said ``said`` (and, if not ``running``, exited):
        its output; SlurmTestbedError with it if it exits first or takes too long."""
        proc = next(p for p in self.procs if p.name == name)  # type: ignore[attr-defined]
        logs = [self.root / "log" / f"{name}.stdout", self.root / "log" / f"{name}.log"]
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            text = "".join(p.read_text(errors="replace") for p in logs if p.exists())
            done = proc.poll() is not None
            if said in text and (running or done):
                return text
            if done:
                raise SlurmTestbedError(f"{name} exited with {proc.returncode}:\n{_tail(text)}")
            if time.monotonic() > deadline:
                raise SlurmTestbedError(f"{name} never said {said!r}:\n{_tail(text)}")
            time.sleep(0.1)

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
        self, text: str, overrides: dict[str, str], ports: list[int]
    ) -> tuple[str, dict[str, str], dict[str, str]]:
        """Site settings replaced, each node reached at this host on its own port; with
        each node's expected Gres and the hostname its slurmd must find it by."""
        if "accounting_storage/slurmdbd" not in text:
            overrides = {k: v for k, v in overrides.items() if k != "AccountingStoragePort"}
        lines, seen, gres, hostnames = [], set(), {}, {}
        rename = can_rename()
        for line in text.splitlines():
            key = _key(line)
            if key == "NodeName":
                fields = dict(f.split("=", 1) for f in line.split())
                names = self.expand(fields["NodeName"])
                hosts = self.expand(fields.get("NodeHostname", fields["NodeName"]))
                start = ports[len(gres)]
                for n, h in zip(names, hosts):
                    gres[n] = fields.get("Gres", "(null)")
                    hostnames[n] = h
                fields.update(
                    NodeAddr="127.0.0.1",
                    Port=f"[{start}-{start + len(names) - 1}]" if len(names) > 1 else str(start),
                )
                if not rename:  # every slurmd on this host's name, found by -N instead
                    fields["NodeHostname"] = this_host()
                line = " ".join(f"{k}={v}" for k, v in fields.items())
            elif key in overrides:
                seen.add(key)
                line = f"{key}={overrides[key]}"
            lines.append(line)
        lines += [
            f"{k}={v}" for k, v in overrides.items() if k not in seen and k not in _IF_PRESENT
        ]
        return "\n".join(lines) + "\n", gres, hostnames

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
        # A setting slurmctld drops with only a log line ("PriorityWeightFairshare can only
        # be used with SlurmDBD, ignoring") is a silent failure too.
        ctld = (self.root / "log" / "slurmctld.log").read_text(errors="replace")
        ignored = [line for line in ctld.splitlines() if re.search(r"error: .*ignoring", line)]
        if ignored:
            raise SlurmTestbedError("slurmctld ignored settings:\n" + "\n".join(ignored))

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


def _key(line: str) -> str:
    return line.split("=", 1)[0].strip() if "=" in line and not line.startswith("#") else ""


def _key_value(line: str) -> str:
    """The value of a line's first ``key=value``: ``node[01-02]`` of a NodeName line."""
    return line.split()[0].split("=", 1)[1]


def _rewrite(text: str, overrides: dict[str, str]) -> str:
    """``key=value`` lines of ``overrides`` replaced (added where missing), the rest kept."""
    lines, seen = [], set()
    for line in text.splitlines():
        key = _key(line)
        if key in overrides:
            seen.add(key)
            line = f"{key}={overrides[key]}"
        lines.append(line)
    lines += [f"{k}={v}" for k, v in overrides.items() if k not in seen]
    return "\n".join(lines) + "\n"


def can_rename() -> bool:
    """Can a daemon get a hostname of its own here (a UTS namespace: root only)?"""
    return os.geteuid() == 0 and shutil.which("unshare") is not None


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
