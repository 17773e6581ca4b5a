#!/usr/bin/env python3
"""An SSH testbed on one machine: N real ``sshd`` processes on 127.0.0.1 with simulated GPUs.

Standard library only, Python 3.9+; a script and an importable module::

    python tests/testbed.py up 3 [--dir DIR] [--gpus 4] [--delay-ms 30] [--jump]   # prints DIR
    ssh -F DIR/ssh_config node02 nvidia-smi -L
    python tests/testbed.py status DIR
    python tests/testbed.py stop-node DIR node02      # a dead node; start-node brings it back
    python tests/testbed.py down DIR

    tb = Testbed.up(3)        # the same from Python; tb.down() when done

Every node is one sshd (own ed25519 host key, key-only login as the current user with one
client key) whose sessions get ``GPUCLAIM_NODE``, ``GPUCLAIM_SIM_STATE`` (the fake
``nvidia-smi``'s JSON state), their own ``HOME`` and ``TMUX_TMPDIR`` (one tmux server per node)
and ``DIR/bin`` first on ``PATH``.  ``--delay-ms`` adds a userspace delay proxy (this kernel
has no netem) and ``DIR/ssh_config.delayed``; ``--jump`` adds a node ``hidden01`` reached only
through ``ProxyJump jump``.  See ../../shared/ssh-testbed.md for the recipe and its pitfalls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import logging
import os
import pwd
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Optional

FAKE_SMI = Path(__file__).resolve().parents[1] / "gpuclaim/sim/fake_nvidia_smi.py"
FAKE_NVML = FAKE_SMI.with_name("fake_pynvml.py")
FAKE_REPORT = FAKE_SMI.with_name("fake_report.py")  # its -q -x, -L and MIG part
DEFAULT_GPU: dict[str, Any] = {"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559}
DRIVER_VERSION = "550.54.15"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARKER = "testbed.json"  # written first, so `down` recognises even a half-built testbed
JUMP = "jump"
HIDDEN = "hidden01"
READY_TIMEOUT_S = 10.0
SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the NUL

log = logging.getLogger("testbed")


class TestbedError(RuntimeError):
    """The testbed could not be built or driven; the message says what to do."""

    __test__ = False  # not a pytest test class, even when imported into a test module


class MissingTool(TestbedError):
    """A program the testbed needs is not installed."""


# --- tools ---------------------------------------------------------------------------------

TOOLS = {"sshd": "openssh-server", "ssh": "openssh-client", "ssh-keygen": "openssh-client"}


def find_tool(name: str, path: Optional[str] = None) -> str:
    """Absolute path of ``name`` (sbin dirs included: sshd is not on a user's PATH)."""
    if path is None:
        path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    found = shutil.which(name, path=path)
    if not found:
        package = TOOLS.get(name, name)
        raise MissingTool(
            f"{name} not found: the SSH testbed needs the {package} package "
            f"(apt-get install {package})"
        )
    # sshd refuses to re-exec itself from a relative path
    return os.path.abspath(found)


def require_tools(path: Optional[str] = None) -> dict[str, str]:
    """{name: absolute path} of sshd, ssh and ssh-keygen, or MissingTool naming the package."""
    return {name: find_tool(name, path) for name in TOOLS}


# --- small helpers -------------------------------------------------------------------------


def _write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1, chosen by the kernel (bind to port 0)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:  # all held open until every one is chosen, so they differ
        for s in socks:
            s.close()


def _read_proc(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _stat(pid: int) -> Optional[tuple[str, int]]:
    """(state letter, parent pid) of a process, or None when it is gone."""
    raw = _read_proc(pid, "stat").decode("ascii", "replace")
    try:
        fields = raw.rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (IndexError, ValueError):
        return None


def is_alive(pid: int) -> bool:
    """True for a running process; a zombie counts as dead (PID 1 reaps lazily here)."""
    st = _stat(pid)
    return st is not None and st[0] not in "ZXx"


def _process_table() -> dict[int, int]:
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                table[int(entry)] = st[1]
    return table


def _descendants(roots: Iterable[int], table: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _self_and_ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        st = _stat(pid)
        pid = st[1] if st else 0
    return pids


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


# --- the testbed ---------------------------------------------------------------------------


class Testbed:
    """A running testbed: sshd nodes, their ssh config, keys and the fake GPUs' state."""

    __test__ = False  # not a pytest test class, even when imported into a test module

    def __init__(self, directory: Path, info: dict[str, Any]) -> None:
        self.dir = directory
        self.info = info
        self.nodes: list[str] = list(info["nodes"])
        self.hidden: list[str] = list(info.get("hidden", []))
        self.jump_host: Optional[str] = info.get("jump")
        self.gpus: int = int(info.get("gpus", 4))
        self.delay_ms: int = int(info.get("delay_ms", 0))
        self.nvml: bool = bool(info.get("nvml", False))
        # commands the nodes lack (their PATH: every system command but these)
        self.without: tuple[str, ...] = tuple(info.get("without", ()))
        self.node_env: dict[str, dict[str, str]] = dict(info.get("node_env", {}))
        self.user: str = info.get("user") or pwd.getpwuid(os.getuid()).pw_name
        # real Unix accounts that log in to every node with keys of their own (made by the
        # caller: useradd), each with its HOME per node, or one for all nodes (NFS-style)
        self.accounts: tuple[str, ...] = tuple(info.get("accounts", ()))
        self.shared_homes: bool = bool(info.get("shared_homes", False))
        self.ports: dict[str, int] = {k: int(v) for k, v in info.get("ports", {}).items()}
        self.proxy_ports: dict[str, int] = {
            k: int(v) for k, v in info.get("proxy_ports", {}).items()
        }
        self.ssh_config = directory / "ssh_config"
        self.ssh_config_delayed = directory / "ssh_config.delayed" if self.delay_ms else None
        self.known_hosts = directory / "client" / "known_hosts"
        self.identity = directory / "client" / "id_ed25519"
        self.state_path = directory / "gpus.json"
        self.tools = require_tools()
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- names and paths ----------------------------------------------------------------------
    @property
    def hosts(self) -> list[str]:
        """Every sshd of the testbed: the nodes, then the jump host and the hidden nodes."""
        return self.nodes + ([self.jump_host] if self.jump_host else []) + self.hidden

    def node_dir(self, name: str) -> Path:
        return self.dir / "nodes" / name

    def home_of(self, name: str) -> Path:
        """The node's sessions' HOME."""
        return Path(self.node_env.get(name, {}).get("HOME") or self.node_dir(name) / "home")

    def account_home(self, node: str, account: str) -> Path:
        """An account's HOME on a node: its own per node, or one for every node."""
        if self.shared_homes:
            return self.dir / "homes" / account
        return self.node_dir(node) / "homes" / account

    def account_identity(self, account: str) -> Path:
        return self.dir / "client" / account / "id_ed25519"

    def account_ssh_config(self, account: str) -> Path:
        return self.dir / f"ssh_config.{account}"

    def log_path(self, name: str) -> Path:
        """The node's sshd log (``-E``); the jump host logs at DEBUG1."""
        return self.node_dir(name) / "sshd.log"

    def env(self, delayed: bool = False, account: Optional[str] = None) -> dict[str, str]:
        """Environment variables for a gpuclaim client process that should use this testbed
        (as ``account``, one of ``accounts``: its own ssh config, key and login)."""
        config = self.ssh_config_delayed if delayed else self.ssh_config
        if account is not None:
            config = self.account_ssh_config(account)
        if config is None:
            raise TestbedError("this testbed has no delay proxy (up with delay_ms > 0)")
        return {
            "GPUCLAIM_SSH_CONFIG": str(config),
            # lets down() sweep up client processes (and ControlMasters) started with it
            "GPUCLAIM_TESTBED": str(self.dir),
            "GPUCLAIM_TESTBED_NODES": ",".join(self.nodes),
        }

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        n: int,
        directory: Optional[Path] = None,
        gpus: int = 4,
        delay_ms: int = 0,
        jump: bool = False,
        nvml: bool = False,
        without: tuple[str, ...] = (),
        node_env: Optional[dict[str, dict[str, str]]] = None,
        accounts: tuple[str, ...] = (),
        shared_homes: bool = False,
    ) -> Testbed:
        """Start ``n`` nodes of ``gpus`` GPUs each; a failure tears down what it started.
        With ``nvml``, the nodes' Python also finds the simulated GPUs' NVML face as
        ``pynvml`` (a node with a driver); else they have only ``nvidia-smi``. ``node_env``
        sets more of a node's sessions' environment, by node (``HOME``: a home elsewhere,
        made with its ``.bashrc``). ``accounts``: real Unix accounts (they must exist) that
        log in to every node as themselves, each with a key and a HOME of its own per node
        (one HOME for all nodes with ``shared_homes``); ``env(account=...)`` is theirs."""
        if n < 1 or gpus < 0 or delay_ms < 0:
            raise TestbedError(f"bad testbed size: n={n} gpus={gpus} delay_ms={delay_ms}")
        require_tools()
        if directory is None:
            # short on purpose: tmux sockets live under it and sun_path holds 107 bytes
            directory = Path(tempfile.mkdtemp(prefix="gctb-", dir="/tmp"))
        directory = Path(os.path.abspath(directory))
        _check_directory(directory, n)
        directory.mkdir(parents=True, exist_ok=True)
        info: dict[str, Any] = {
            "nodes": [f"node{i:02d}" for i in range(1, n + 1)],
            "hidden": [HIDDEN] if jump else [],
            "jump": JUMP if jump else None,
            "gpus": gpus,
            "delay_ms": delay_ms,
            "nvml": nvml,
            "without": list(without),
            "node_env": node_env or {},
            "accounts": list(accounts),
            "shared_homes": shared_homes,
            "user": pwd.getpwuid(os.getuid()).pw_name,
            "created_by": os.getpid(),
        }
        _write_atomic(directory / MARKER, json.dumps(info, indent=1))
        tb = cls(directory, info)
        started = time.monotonic()
        try:
            tb._build()
        except BaseException:
            log.error("testbed: up failed, tearing down %s", directory)
            tb.down()
            raise
        log.info(
            "testbed: %d node(s)%s up in %.2f s: ssh -F %s node01 ...",
            n,
            " + jump/hidden01" if jump else "",
            time.monotonic() - started,
            tb.ssh_config,
        )
        return tb

    @classmethod
    def load(cls, directory: Path) -> Testbed:
        """The testbed that ``up`` built in ``directory`` (for the CLI's other commands)."""
        directory = Path(os.path.abspath(directory))
        try:
            info = json.loads((directory / MARKER).read_text())
        except (OSError, ValueError) as exc:
            raise TestbedError(f"{directory} is not a testbed ({MARKER}: {exc})") from None
        return cls(directory, info)

    def _build(self) -> None:
        for sub in ("bin", "client", "nodes"):
            (self.dir / sub).mkdir(exist_ok=True)
        if self.without:  # a node that lacks a command: the system's others, linked
            limited = self.dir / "sysbin"
            limited.mkdir(exist_ok=True)
            for directory in SYSTEM_PATH.split(":"):
                for entry in sorted(Path(directory).glob("*")) if Path(directory).is_dir() else []:
                    link = limited / entry.name
                    if entry.name not in self.without and not link.exists():
                        link.symlink_to(entry)
        for name in self.hosts:
            for sub in ("home", "run"):
                (self.node_dir(name) / sub).mkdir(parents=True, exist_ok=True)
            # bash reads ~/.bashrc for `ssh host cmd`; a per-node HOME keeps root's rc out
            home = self.home_of(name)
            home.mkdir(parents=True, exist_ok=True)
            (home / ".bashrc").write_text("# testbed node home\n")
        if self.accounts:
            self._make_account_dirs()
        self._write_state()
        smi = self.dir / "bin" / "nvidia-smi"
        shutil.copyfile(FAKE_SMI, smi)
        shutil.copyfile(FAKE_REPORT, smi.with_name("fake_report.py"))
        smi.chmod(0o755)
        if self.nvml:
            (self.dir / "nvml").mkdir(exist_ok=True)
            shutil.copyfile(FAKE_SMI, self.dir / "nvml" / "fake_nvidia_smi.py")
            shutil.copyfile(FAKE_REPORT, self.dir / "nvml" / "fake_report.py")
            shutil.copyfile(FAKE_NVML, self.dir / "nvml" / "pynvml.py")
        self._make_keys()
        # sshd as root exits 255 without its privilege separation directory
        with contextlib.suppress(PermissionError):
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self._warn_if_locked()
        if self.accounts:
            self._start_driver()
        self._start_all()
        if self.delay_ms:
            self._start_proxy()
        self._write_client_files()

    def _make_account_dirs(self) -> None:
        """What other accounts need: a way in (0755 down to what they use), a tmux socket
        directory they share as /tmp is shared (1777), and homes of their own."""
        for path in (self.dir, self.dir / "bin", self.dir / "client", self.dir / "nodes"):
            path.chmod(0o755)
        for name in self.hosts:
            self.node_dir(name).chmod(0o755)
            (self.node_dir(name) / "run").chmod(0o1777)
            for account in self.accounts:
                home = self.account_home(name, account)
                home.mkdir(parents=True, exist_ok=True)
                (home / ".bashrc").write_text("# testbed account home\n")
                entry = pwd.getpwnam(account)
                for path in (home, home / ".bashrc"):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
                home.chmod(0o700)
                home.parent.chmod(0o755)

    def _start_driver(self) -> None:
        """The fake nvidia-smi's "driver": a root process that lists every account's jobs,
        since another account's environment (where a fake job says its GPUs) is closed."""
        sock = self.dir / "driver.sock"
        with open(self.dir / "driver.log", "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gpuclaim.sim.sim_driver", str(sock)],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                env=self._daemon_env(),
            )
        self._children[proc.pid] = proc
        self._set_pid("driver", "driver", proc.pid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (self.dir / "driver.log").read_text(errors="replace")[-500:]
                raise TestbedError(f"the fake GPU driver did not start: {tail}")
            time.sleep(0.005)

    def _write_state(self) -> None:
        nodes = {
            name: {"gpus": [dict(DEFAULT_GPU) for _ in range(self.gpus)]}
            for name in self.nodes + self.hidden
        }
        state = {"driver_version": DRIVER_VERSION, "nodes": nodes}
        _write_atomic(self.state_path, json.dumps(state, indent=1))

    def _make_keys(self) -> None:
        for account in self.accounts:
            self.account_identity(account).parent.mkdir(exist_ok=True)
        jobs = (
            [(self.identity, "testbed-client")]
            + [(self.account_identity(a), a) for a in self.accounts]
            + [(self.node_dir(h) / "ssh_host_ed25519_key", h) for h in self.hosts]
        )
        procs = [
            subprocess.Popen(
                [
                    self.tools["ssh-keygen"],
                    "-q",
                    "-t",
                    "ed25519",
                    "-N",
                    "",
                    "-C",
                    comment,
                    "-f",
                    str(path),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for path, comment in jobs
        ]
        for proc in procs:  # in parallel: 17 keys one after another cost ~0.1 s
            _, err = proc.communicate(timeout=30)
            if proc.returncode:
                raise TestbedError(f"ssh-keygen failed: {err.decode(errors='replace')}")
        pub = Path(f"{self.identity}.pub").read_text()
        (self.dir / "client" / "authorized_keys").write_text(pub)
        if self.accounts:  # one authorized_keys per login (%u), each account its own key
            (self.dir / "client" / f"authorized_keys.{self.user}").write_text(pub)
            for account in self.accounts:
                key = self.account_identity(account)
                (self.dir / "client" / f"authorized_keys.{account}").write_text(
                    Path(f"{key}.pub").read_text()
                )
                entry = pwd.getpwnam(account)
                for path in (key.parent, key, Path(f"{key}.pub")):
                    os.chown(path, entry.pw_uid, entry.pw_gid)
                key.parent.chmod(0o700)

    def _warn_if_locked(self) -> None:
        # with UsePAM no, sshd refuses a user whose shadow password starts with "!"
        with contextlib.suppress(OSError):
            for line in Path("/etc/shadow").read_text().splitlines():
                fields = line.split(":")
                if fields[0] == self.user and fields[1:2] and fields[1].startswith("!"):
                    log.warning("testbed: account %s is locked; sshd will refuse it", self.user)

    def _sshd_config(self, name: str, penalties: bool) -> str:
        ndir = self.node_dir(name)
        node_env = {
            "GPUCLAIM_NODE": name,
            "GPUCLAIM_TESTBED": str(self.dir),
            "GPUCLAIM_SIM_STATE": str(self.state_path),
            "TMUX_TMPDIR": str(ndir / "run"),
            "HOME": str(ndir / "home"),
            "PATH": f"{self.dir / 'bin'}:{self.dir / 'sysbin' if self.without else SYSTEM_PATH}",
            **self.node_env.get(name, {}),
        }
        if self.nvml:
            node_env["PYTHONPATH"] = str(self.dir / "nvml")
        if self.accounts:
            node_env["GPUCLAIM_SIM_DRIVER"] = str(self.dir / "driver.sock")
        lines = [
            f"# gpuclaim testbed: {name}",
            f"Port {self.ports[name]}",
            "ListenAddress 127.0.0.1",
            "AddressFamily inet",
            f"HostKey {ndir / 'ssh_host_ed25519_key'}",
            # written only after the listen socket is bound: the readiness signal
            f"PidFile {ndir / 'sshd.pid'}",
            "AuthorizedKeysFile "
            + str(
                self.dir / "client" / ("authorized_keys.%u" if self.accounts else "authorized_keys")
            ),
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            # keys live under /tmp (mode 1777): "bad ownership or modes for directory /tmp"
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            # a fan-out opens many connections at once; the default 10:30:100 drops some
            "MaxStartups 200",
            "MaxSessions 100",
            "AllowTcpForwarding yes",
            "X11Forwarding no",
            "Subsystem sftp internal-sftp",
            # DEBUG1 on the jump host logs each direct-tcpip hop, which tests look for
            f"LogLevel {'DEBUG1' if name == self.jump_host else 'INFO'}",
        ]
        if penalties:  # OpenSSH >= 9.8 would otherwise lock out a test that fails logins
            lines.append("PerSourcePenalties no")
        if not self.accounts:
            lines.append("SetEnv " + " ".join(f"{k}={v}" for k, v in node_env.items()))
            return "\n".join(lines) + "\n"
        # Each login its own HOME: in a Match block of its own (a global SetEnv would be the
        # one sshd keeps), the node's environment repeated in each
        for user in (self.user, *self.accounts):
            env = dict(node_env)
            if user != self.user:
                env["HOME"] = str(self.account_home(name, user))
            lines += [
                f"Match User {user}",
                "    SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()),
            ]
        return "\n".join(lines) + "\n"

    def _supports_penalties(self) -> bool:
        probe = self.dir / "nodes" / ".probe_config"
        probe.write_text(self._sshd_config(self.hosts[0], penalties=True))
        try:
            proc = subprocess.run(
                [self.tools["sshd"], "-t", "-f", str(probe)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=30,
            )
        finally:
            probe.unlink()
        if proc.returncode == 0:
            return True
        if "PerSourcePenalties" not in proc.stderr:
            raise TestbedError(f"sshd -t rejects the node config: {proc.stderr.strip()}")
        return False

    def _start_all(self) -> None:
        names = self.hosts
        self.ports = dict(zip(names, free_ports(len(names))))
        penalties = self._supports_penalties()
        pending = list(names)
        for attempt in range(5):
            for name in pending:
                _write_atomic(
                    self.node_dir(name) / "sshd_config", self._sshd_config(name, penalties)
                )
            procs = {name: self._spawn_sshd(name) for name in pending}
            failed = self._wait_ready(procs)
            # a port chosen by bind(0) can be taken before sshd binds it: pick another
            pending = [n for n, why in failed.items() if "already in use" in why]
            other = {n: why for n, why in failed.items() if n not in pending}
            if other:
                name, why = next(iter(other.items()))
                raise TestbedError(f"sshd for {name} did not start: {why}")
            if not pending:
                break
            log.warning("testbed: port in use for %s, retrying (%d)", pending, attempt + 1)
            self.ports.update(zip(pending, free_ports(len(pending))))
        else:
            raise TestbedError(f"no free port for {pending} after 5 tries")
        self._record_info()

    def _spawn_sshd(self, name: str) -> subprocess.Popen[bytes]:
        ndir = self.node_dir(name)
        with contextlib.suppress(FileNotFoundError):
            (ndir / "sshd.pid").unlink()
        cmd = [self.tools["sshd"], "-D", "-f", str(ndir / "sshd_config")]
        if self.shared_homes:
            # hosts that share a home (NFS) differ in their names: a UTS namespace each
            unshare = shutil.which("unshare", path=SYSTEM_PATH) or "unshare"
            cmd = [unshare, "--uts", "sh", "-c", f'hostname {name} && exec "$0" "$@"', *cmd]
        proc = subprocess.Popen(
            [*cmd, "-E", str(ndir / "sshd.log")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # setsid: no terminal signals from the caller's session
            env=self._daemon_env(),
        )
        self._children[proc.pid] = proc
        return proc

    def _daemon_env(self) -> dict[str, str]:
        # sshd builds each session's environment afresh, so this reaches only the daemons
        # themselves, where down()'s environment sweep can find them
        return {"PATH": SYSTEM_PATH, "GPUCLAIM_TESTBED": str(self.dir), "LANG": "C.UTF-8"}

    def _wait_ready(self, procs: dict[str, subprocess.Popen[bytes]]) -> dict[str, str]:
        """Wait for each sshd's pid file; {name: why} for those that exited instead."""
        failed: dict[str, str] = {}
        pending = dict(procs)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while pending:
            for name, proc in list(pending.items()):
                pidfile = self.node_dir(name) / "sshd.pid"
                # sshd creates the file, then writes it: it may be empty for a moment
                with contextlib.suppress(OSError, ValueError, IndexError):
                    if int(pidfile.read_text().split()[0]) == proc.pid:
                        self._set_pid(name, "sshd", proc.pid)
                        del pending[name]
                        continue
                if proc.poll() is not None:
                    failed[name] = f"exit {proc.returncode}: {self._log_tail(name)}"
                    del pending[name]
            if pending and time.monotonic() > deadline:
                for name, proc in pending.items():
                    proc.kill()
                    proc.wait()
                    failed[name] = f"no pid file after {READY_TIMEOUT_S:.0f} s"
                break
            if pending:
                time.sleep(0.005)
        return failed

    def _log_tail(self, name: str) -> str:
        try:
            lines = self.log_path(name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-3:]) or "(empty log)"

    def _start_proxy(self) -> None:
        targets = {h: self.ports[h] for h in self.hosts if h not in self.hidden}
        _write_atomic(self.dir / "proxy_targets.json", json.dumps(targets))
        out = self.dir / "proxy_ports.json"
        rtt = [str(self.delay_ms)]
        with open(self.dir / "proxy.log", "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "_proxy", str(self.dir), *rtt],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                env={**self._daemon_env(), "PYTHONDONTWRITEBYTECODE": "1"},
            )
        self._children[proc.pid] = proc
        self._set_pid("proxy", "proxy", proc.pid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not out.exists():
            if proc.poll() is not None:
                tail = (self.dir / "proxy.log").read_text(errors="replace")[-500:]
                raise TestbedError(f"delay proxy exited {proc.returncode}: {tail}")
            if time.monotonic() > deadline:
                raise TestbedError("delay proxy did not start")
            time.sleep(0.005)
        self.proxy_ports = {k: int(v) for k, v in json.loads(out.read_text()).items()}
        self._record_info()

    def _write_client_files(self) -> None:
        lines = []
        for name in self.hosts:
            pub = " ".join(
                (self.node_dir(name) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            )
            # the same key answers on the node's own port and on its proxy port
            ports = [self.ports[name]] + (
                [self.proxy_ports[name]] if name in self.proxy_ports else []
            )
            lines.append(",".join(f"[127.0.0.1]:{p}" for p in ports) + f" {pub}\n")
        self.known_hosts.write_text("".join(lines))
        self.known_hosts.chmod(0o644)
        _write_atomic(self.ssh_config, self._ssh_config_text(self.ports))
        for account in self.accounts:
            _write_atomic(
                self.account_ssh_config(account),
                self._ssh_config_text(self.ports, account),
            )
        if self.ssh_config_delayed is not None:
            # the jump host is reached through the proxy, hidden01 from the jump host directly
            delayed = {**self.ports, **self.proxy_ports}
            _write_atomic(self.ssh_config_delayed, self._ssh_config_text(delayed))
        ports = "".join(f"{h} {self.ports[h]}\n" for h in self.hosts)
        ports += "".join(f"{h}.delayed {p}\n" for h, p in self.proxy_ports.items())
        _write_atomic(self.dir / "ports", ports)
        env = self.env()
        if self.ssh_config_delayed is not None:
            env["GPUCLAIM_SSH_CONFIG_DELAYED"] = str(self.ssh_config_delayed)
        _write_atomic(
            self.dir / "env", "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        )

    def _ssh_config_text(self, ports: dict[str, int], account: Optional[str] = None) -> str:
        out = [f"# gpuclaim testbed {self.dir}: ssh -F <this file> node01 ..."]
        for name in self.hosts:
            out += [f"Host {name}", "    HostName 127.0.0.1", f"    Port {ports[name]}"]
            if name in self.hidden:
                out.append(f"    ProxyJump {self.jump_host}")
        patterns = "node*" + (f" {self.jump_host} hidden*" if self.jump_host else "")
        out += [
            f"Host {patterns}",
            f"    User {account or self.user}",
            f"    IdentityFile {self.account_identity(account) if account else self.identity}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {self.known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            "    LogLevel ERROR",
        ]
        return "\n".join(out) + "\n"

    def _record_info(self) -> None:
        self.info.update(ports=self.ports, proxy_ports=self.proxy_ports)
        _write_atomic(self.dir / MARKER, json.dumps(self.info, indent=1))

    # -- recorded pids ------------------------------------------------------------------------
    def _pids_file(self) -> Path:
        return self.dir / "pids"

    def read_pids(self) -> dict[str, tuple[int, str]]:
        """{name: (pid, kind)} from ``DIR/pids``; kind is ``sshd`` or ``proxy``."""
        pids = {}
        with contextlib.suppress(OSError):
            for line in self._pids_file().read_text().splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0].isdigit():
                    pids[parts[2]] = (int(parts[0]), parts[1])
        return pids

    def _set_pid(self, name: str, kind: str, pid: Optional[int]) -> None:
        with self._locked():
            pids = self.read_pids()
            if pid is None:
                pids.pop(name, None)
            else:
                pids[name] = (pid, kind)
            text = "".join(f"{p} {k} {n}\n" for n, (p, k) in pids.items())
            _write_atomic(self._pids_file(), text)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # the CLI and a test's Testbed object may edit the same files at once
        with open(self.dir / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _owned(self, pid: int) -> bool:
        """Is ``pid`` still a process of this testbed (not a reused pid)?"""
        return is_alive(pid) and self._mentioned_by(pid)

    def _mentioned_by(self, pid: int) -> bool:
        """Does the process's command line name this directory or a file in it?"""
        args = _read_proc(pid, "cmdline").split(b"\0")
        here = str(self.dir).encode()
        # sshd rewrites its title into one string ("sshd: /usr/sbin/sshd -D -f DIR/...")
        return any(a == here or here + b"/" in a for a in args)

    def _wait_dead(self, pids: Iterable[int], timeout: float) -> list[int]:
        """Wait until each pid has exited (zombies count); the ones still alive after."""
        left = set(pids)
        deadline = time.monotonic() + timeout
        while True:
            for pid in list(left):
                child = self._children.get(pid)
                if child is not None and child.poll() is not None:
                    del self._children[pid]  # reaped: our own child leaves no zombie
                if not is_alive(pid):
                    left.discard(pid)
            if not left or time.monotonic() > deadline:
                return sorted(left)
            time.sleep(0.01)

    # -- driving ------------------------------------------------------------------------------
    def ssh(
        self,
        node: str,
        command: str,
        *,
        delayed: bool = False,
        timeout: float = 30,
        options: Iterable[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        """Run ``ssh -F ssh_config NODE COMMAND`` (stdin closed) and capture its output."""
        config = self.ssh_config_delayed if delayed else self.ssh_config
        if config is None:
            raise TestbedError("this testbed has no delay proxy (up with delay_ms > 0)")
        return subprocess.run(
            [self.tools["ssh"], "-F", str(config), *options, node, command],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "GPUCLAIM_TESTBED": str(self.dir)},
        )

    def read_state(self) -> dict[str, Any]:
        """The fake nvidia-smi's state (``gpus.json``)."""
        state: dict[str, Any] = json.loads(self.state_path.read_text())
        return state

    def set_gpus(self, node: str, gpus: list[dict[str, Any]]) -> None:
        """Replace the node's simulated GPUs (a list of GPU dicts, see fake_nvidia_smi)."""
        self._edit_node(node, {"gpus": gpus})

    def set_node(self, node: str, **keys: Any) -> None:
        """Set node keys of the state, e.g. ``fail=True`` or ``delay_ms=300``; None removes."""
        self._edit_node(node, keys)

    def _edit_node(self, node: str, keys: dict[str, Any]) -> None:
        if node not in self.nodes + self.hidden:
            raise TestbedError(f"no node {node!r} with GPUs in this testbed")
        with self._locked():
            state = self.read_state()
            entry = state.setdefault("nodes", {}).setdefault(node, {})
            for key, value in keys.items():
                if value is None:
                    entry.pop(key, None)
                else:
                    entry[key] = value
            # readers must never see half a file: write aside, then rename
            _write_atomic(self.state_path, json.dumps(state, indent=1))

    def stop_node(self, name: str) -> None:
        """Kill the node's sshd and its connections (jobs and tmux keep running)."""
        if name not in self.hosts:
            raise TestbedError(f"no node {name!r} in this testbed")
        pid = self.read_pids().get(name, (0, ""))[0]
        if pid and self._owned(pid):
            # stopped first: a connection it accepted while we listed its children would
            # otherwise live on as an orphan session (a loaded CI saw a "stopped" node answer)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
            victims = {pid} | _descendants([pid], _process_table())
            for victim in victims:
                _kill(victim)
            left = self._wait_dead(victims, 5)
            if pid in left:
                raise TestbedError(f"sshd {pid} of {name} survived SIGKILL")
        self._set_pid(name, "sshd", None)
        with contextlib.suppress(FileNotFoundError):
            (self.node_dir(name) / "sshd.pid").unlink()

    def node_processes(self, name: str) -> set[int]:
        """The node's sshd, its sessions, and every process started on the node (they carry
        its ``GPUCLAIM_NODE``: warm agents, queue keepers, tmux servers, jobs)."""
        pid = self.read_pids().get(name, (0, ""))[0]
        table = _process_table()
        found = {pid} | _descendants([pid], table) if pid and self._owned(pid) else set()
        markers = {f"GPUCLAIM_NODE={name}".encode(), f"GPUCLAIM_TESTBED={self.dir}".encode()}
        for other in table:
            if markers <= set(_read_proc(other, "environ").split(b"\0")):
                found.add(other)
        return found - _self_and_ancestors()

    def reboot_node(self, name: str) -> None:
        """Every process of the node dies at once (its sshd, warm agent, tmux server, job
        wrappers and jobs), then its sshd starts again: a reboot, but for the boot id."""
        victims = self.node_processes(name)
        for pid in victims:
            _kill(pid)
        left = self._wait_dead(victims, 5)
        if left:
            raise TestbedError(f"{name}: processes {sorted(left)} survived SIGKILL")
        self._set_pid(name, "sshd", None)
        with contextlib.suppress(FileNotFoundError):
            (self.node_dir(name) / "sshd.pid").unlink()
        self.start_node(name)

    def freeze_node(self, name: str) -> set[int]:
        """Stop (SIGSTOP) the node's sshd and every process of it: a node that hangs (a
        soft lockup, a hung NFS mount), its TCP connections open; ``thaw_node`` resumes."""
        frozen = self.node_processes(name)
        for pid in frozen:
            _kill(pid, signal.SIGSTOP)
        self.info.setdefault("frozen", {})[name] = sorted(frozen)
        return frozen

    def thaw_node(self, name: str) -> None:
        for pid in self.info.get("frozen", {}).pop(name, []):
            _kill(pid, signal.SIGCONT)

    def start_node(self, name: str) -> None:
        """Start the node's sshd again on the same port (a no-op when it runs)."""
        if name not in self.hosts:
            raise TestbedError(f"no node {name!r} in this testbed")
        pid = self.read_pids().get(name, (0, ""))[0]
        if pid and self._owned(pid):
            return
        failed = self._wait_ready({name: self._spawn_sshd(name)})
        if failed:
            raise TestbedError(f"sshd for {name} did not restart: {failed[name]}")

    def status(self) -> dict[str, dict[str, Any]]:
        """{name: {"kind", "port", "pid", "up"}} for every sshd and the delay proxy."""
        pids = self.read_pids()
        rows: dict[str, dict[str, Any]] = {}
        for name in [*self.hosts, *(["proxy"] if self.delay_ms else [])]:
            pid, kind = pids.get(name, (0, "proxy" if name == "proxy" else "sshd"))
            rows[name] = {
                "kind": kind,
                "port": self.ports.get(name),
                "pid": pid or None,
                "up": bool(pid) and self._owned(pid),
            }
        return rows

    # -- teardown -----------------------------------------------------------------------------
    def down(self) -> None:
        """Stop everything this testbed started and remove its directory; idempotent."""
        started = time.monotonic()
        for name in list(self.info.get("frozen", {})):
            self.thaw_node(name)  # a stopped tmux server would not answer kill-server
        if not self.dir.exists():
            self._wait_dead(list(self._children), 1)
            return
        keep = _self_and_ancestors()
        table = _process_table()
        roots = {p for p, _ in self.read_pids().values() if self._owned(p)}
        roots |= {p for p in self._children if self._owned(p)}
        # sshd's per-connection children: find them before their parent dies and they move
        victims = (roots | _descendants(roots, table)) - keep
        self._kill_tmux_servers()
        for pid in victims:
            _kill(pid)
        # anything else of ours: session leftovers (nohup, HUP-proof tmux jobs), clients
        # started with env(), ssh ControlMasters whose command line names our files
        marker = f"GPUCLAIM_TESTBED={self.dir}".encode()
        for _ in range(5):
            found = set()
            for pid in _process_table():
                if pid in keep or pid in victims or not is_alive(pid):
                    continue
                if marker in _read_proc(pid, "environ").split(b"\0") or self._mentioned_by(pid):
                    found.add(pid)
            if not found:
                break
            for pid in found:
                _kill(pid)
            victims |= found
        left = self._wait_dead(victims, 5)
        if left:
            log.warning("testbed: still alive after SIGKILL: %s", left)
        for _ in range(3):
            shutil.rmtree(self.dir, ignore_errors=True)
            if not self.dir.exists():
                break
            time.sleep(0.05)  # a dying process may still have created a file
        else:
            raise TestbedError(f"could not remove {self.dir}")
        log.info("testbed: down in %.2f s: %s", time.monotonic() - started, self.dir)

    def _kill_tmux_servers(self) -> None:
        tmux = shutil.which("tmux")
        if tmux is None:
            return  # no tmux, no servers; the environment sweep covers the rest
        socks = [
            sock
            for name in self.hosts
            for sock in self.node_dir(name).glob("run/tmux-*/*")
            if stat.S_ISSOCK(sock.lstat().st_mode)
        ]
        procs = [
            subprocess.Popen(
                [tmux, "-S", str(sock), "kill-server"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for sock in socks
        ]
        for proc in procs:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _check_directory(directory: Path, n: int) -> None:
    text = str(directory)
    # paths go unquoted into sshd_config, ssh_config and SetEnv
    bad = [c for c in " \t\n\"'%\\#" if c in text]
    if bad:
        raise TestbedError(f"testbed directory may not contain {bad!r}: {text}")
    if directory.exists() and any(directory.iterdir()):
        raise TestbedError(f"testbed directory {text} exists and is not empty")
    sock = f"{text}/nodes/node{n:02d}/run/tmux-{os.getuid()}/default"
    if len(sock.encode()) > SUN_PATH_MAX:
        raise TestbedError(f"testbed directory too long for tmux sockets ({len(sock)} > 107)")


# --- the delay proxy (runs as `testbed.py _proxy DIR RTT_MS`) -------------------------------


async def _pump_in(reader: asyncio.StreamReader, queue: asyncio.Queue[Any], delay: float) -> None:
    loop = asyncio.get_running_loop()
    try:
        while True:
            data = await reader.read(65536)
            queue.put_nowait((loop.time() + delay, data))
            if not data:
                return
    except OSError:
        queue.put_nowait((loop.time() + delay, b""))


async def _pump_out(queue: asyncio.Queue[Any], writer: asyncio.StreamWriter) -> None:
    loop = asyncio.get_running_loop()
    while True:
        due, data = await queue.get()
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        if not data:
            with contextlib.suppress(OSError, RuntimeError):
                writer.write_eof()  # half-close, as TCP would pass it on
            return
        writer.write(data)
        await writer.drain()


async def _relay(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, port: int, rtt: float
) -> None:
    upstream: asyncio.Queue[Any] = asyncio.Queue()
    downstream: asyncio.Queue[Any] = asyncio.Queue()
    tasks = [asyncio.ensure_future(_pump_in(client_r, upstream, rtt / 2))]
    writers = [client_w]
    try:
        # the client's connect returned at once; charge the TCP handshake here instead
        await asyncio.sleep(1.5 * rtt)
        server_r, server_w = await asyncio.open_connection("127.0.0.1", port)
        writers.append(server_w)
        tasks.append(asyncio.ensure_future(_pump_in(server_r, downstream, rtt / 2)))
        outs = [
            asyncio.ensure_future(_pump_out(upstream, server_w)),
            asyncio.ensure_future(_pump_out(downstream, client_w)),
        ]
        tasks += outs
        await asyncio.wait(outs, return_when=asyncio.FIRST_EXCEPTION)
    except OSError:
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for writer in writers:
            writer.close()


async def _proxy_serve(directory: Path, rtt_ms: int) -> None:
    targets = json.loads((directory / "proxy_targets.json").read_text())
    rtt = rtt_ms / 1000.0
    ports, servers = {}, []
    for name, port in targets.items():

        async def handle(r: Any, w: Any, port: int = int(port)) -> None:
            await _relay(r, w, port, rtt)

        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
        servers.append(server)
        ports[name] = server.sockets[0].getsockname()[1]
    # binding port 0 here leaves no window in which another process could take a port
    _write_atomic(directory / "proxy_ports.json", json.dumps(ports))
    await asyncio.Event().wait()


# --- command line --------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    """The command line; see the module docstring."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["_proxy"]:
        asyncio.run(_proxy_serve(Path(args_in[1]), int(args_in[2])))
        return 0
    parser = argparse.ArgumentParser(prog="testbed.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="start N nodes; prints the testbed directory")
    p_up.add_argument("n", type=int)
    p_up.add_argument("--dir", type=Path, default=None)
    p_up.add_argument("--gpus", type=int, default=4)
    p_up.add_argument("--delay-ms", type=int, default=0, metavar="RTT")
    p_up.add_argument("--jump", action="store_true")
    p_up.add_argument("--nvml", action="store_true", help="nodes also get a fake pynvml")
    for name, what in (("down", "stop all and remove DIR"), ("status", "show each sshd")):
        sub.add_parser(name, help=what).add_argument("dir", type=Path)
    for name in ("stop-node", "start-node"):
        p = sub.add_parser(name, help=f"{name.split('-')[0]} one node's sshd")
        p.add_argument("dir", type=Path)
        p.add_argument("node")
    args = parser.parse_args(args_in)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "up":
            tb = Testbed.up(args.n, args.dir, args.gpus, args.delay_ms, args.jump, args.nvml)
            print(tb.dir)
            return 0
        if args.command == "down" and not args.dir.exists():
            return 0  # already down
        tb = Testbed.load(args.dir)
        if args.command == "down":
            tb.down()
        elif args.command == "stop-node":
            tb.stop_node(args.node)
        elif args.command == "start-node":
            tb.start_node(args.node)
        else:
            rows = tb.status()
            for name, row in rows.items():
                state = "up" if row["up"] else "DOWN"
                port = row["port"] or "-"
                print(f"{name:<10} {row['kind']:<6} port {port:<6} pid {row['pid']}  {state}")
            return 0 if all(r["up"] for r in rows.values()) else 1
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
