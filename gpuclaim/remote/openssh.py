"""The OpenSSH binary as transport, with ControlMaster multiplexing.

fabric keeps connections only for the life of a process; ``ssh`` with ``ControlPersist``
keeps one master per host between gpuclaim calls, so a command after the first costs one
round trip instead of a new key exchange, and no paramiko import. Host keys, ProxyJump,
Include and everything else are ssh's own handling of your ssh config.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Optional

from gpuclaim.core.errors import UnreachableError
from gpuclaim.core.lazylog import get_logger
from gpuclaim.core.paths import socket_dir, which
from gpuclaim.remote.ssh import CommandResult
from gpuclaim.remote.ssh_messages import describe_ssh_failure

PERSIST = "10m"
log = get_logger(__name__)  # logging imported on first use


# The longest socket name made in the control directory: ``%C`` (a SHA-1, 40 hex digits)
# and the ".XXXXXXXXXXXXXXXX" that ssh appends while it creates a master's socket (mux.c).
# The warm agents' forwarded sockets (remote.warm, "w/w-<12>-<12>.sock") are shorter.
MASTER_NAME_BYTES = 40 + 17


def control_dir() -> Path:
    """Where the master sockets live: private, and short enough for the longest socket in
    it (108 bytes with its NUL), else a short private directory in /tmp."""
    home_cache = Path.home() / ".cache" / "gpuclaim-cm"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    preferred = [Path(xdg) / "gpuclaim-cm"] if xdg and Path(xdg).is_dir() else []
    return socket_dir(
        [*preferred, home_cache], MASTER_NAME_BYTES, "cm", "ssh sockets", UnreachableError
    )


class OpenSshPool:
    """Same interface as ``SshPool``: ``run(alias, command, stdin, timeout)``."""

    def __init__(self, ssh_config_path: Optional[Path] = None, connect_timeout: float = 5.0):
        binary = which("ssh")
        if binary is None:
            raise UnreachableError('ssh_client = "openssh" needs the ssh binary (openssh-client)')
        self.control_dir = control_dir()
        self.ssh_config_path = ssh_config_path
        self.connect_timeout = max(1, round(connect_timeout))
        # A master whose node stops answering (a frozen kernel, a stopped sshd) exits after
        # about two intervals without a word from it, so neither this command nor the next
        # waits on it for the whole deadline: its requests fail, the next connects afresh.
        alive_s = max(1, self.connect_timeout // 2)
        self.base = [
            binary,
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self.control_dir}/%C",
            "-o",
            f"ControlPersist={PERSIST}",
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
            "-o",
            f"ServerAliveInterval={alive_s}",
            "-o",
            "ServerAliveCountMax=1",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
        ]
        if ssh_config_path is not None:
            self.base += ["-F", str(ssh_config_path)]

    def run(
        self, alias: str, command: str, stdin: Optional[bytes] = None, timeout: float = 30.0
    ) -> CommandResult:
        proc = _take_early(alias, command) or subprocess.Popen(
            [*self.base, "--", alias, command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        with _MasterWatch(self, alias, proc, timeout) as watch:
            stdout, stderr = proc.communicate(stdin or b"", timeout=timeout)
        watch.raise_if_fired()
        return self._result(alias, proc.returncode, stdout, stderr)

    def _result(self, alias: str, code: int, stdout: bytes, stderr: bytes) -> CommandResult:
        if code == 255:  # ssh's own failure, not the command's
            text = stderr.decode("utf-8", "replace")
            raise UnreachableError(f"{alias}: {describe_ssh_failure(text, self.connect_timeout)}")
        return CommandResult(code, stdout, stderr)

    def converse(
        self,
        alias: str,
        command: str,
        first: bytes,
        then: Callable[[bytes], Optional[bytes]],
        timeout: float = 30.0,
    ) -> CommandResult:
        """Run ``command`` with ``first`` on its stdin, stdin kept open until the first line
        of its output; ``then(that line)`` says what else to send (None: nothing). The rest
        goes as with ``run``. One SSH session for a request that may need a second part."""
        deadline = time.monotonic() + timeout
        proc = _take_early(alias, command) or subprocess.Popen(
            [*self.base, "--", alias, command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,
        )
        with _MasterWatch(self, alias, proc, timeout) as watch:
            assert proc.stdin is not None and proc.stdout is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(first)
            head = _first_line(proc.stdout, deadline)
            line, newline, _ = head.partition(b"\n")
            more = then(line + newline) if newline else None  # None: that was the answer
            left = max(0.1, deadline - time.monotonic())
            stdout, stderr = proc.communicate(more or b"", timeout=left)
        watch.raise_if_fired()
        return self._result(alias, proc.returncode, head + stdout, stderr)

    def start_detached(
        self, aliases: Sequence[str], command: str, stdin_path: Path
    ) -> subprocess.Popen[bytes]:
        """Start ``command`` on each of ``aliases``, with the file ``stdin_path`` as its input
        and nothing read back, in a session of its own that goes on after this process exits
        (agents' installs after the looks that found them missing). One ``sh`` starts them
        all and waits for them: one spawn from this process, however many nodes, so a
        command that ends with them does not wait on sixteen of its own."""
        script = (
            "c=$1; i=$2; shift 2; for h; do "
            f'{shlex.join(self.base)} -- "$h" "$c" <"$i" & done; wait'
        )
        return subprocess.Popen(
            ["sh", "-c", script, "sh", command, str(stdin_path), *aliases],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def master_alive(self, alias: str) -> bool:
        """Whether a master to ``alias`` runs (a local request, a few ms)."""
        try:
            proc = subprocess.run(
                [*self.base, "-O", "check", "--", alias], capture_output=True, timeout=2.0
            )
        except (subprocess.TimeoutExpired, OSError):
            return False
        return proc.returncode == 0

    def forget(self, alias: str, timeout: float = 10.0) -> None:
        """Close the master to ``alias`` (a local request: it answers with its node dead)."""
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            subprocess.run(
                [*self.base, "-O", "exit", "--", alias], capture_output=True, timeout=timeout
            )

    def close(self) -> None:
        """Masters outlive us on purpose (ControlPersist): the next call reuses them."""


# Sessions started before the CLI finished starting (``remote.early``), by (alias, command):
# ``converse`` takes its session from here when one waits. One process, so a plain dict.
_EARLY: dict[tuple[str, str], subprocess.Popen[bytes]] = {}


def register_early(alias: str, command: str, proc: subprocess.Popen[bytes]) -> None:
    _EARLY[(alias, command)] = proc


def _take_early(alias: str, command: str) -> Optional[subprocess.Popen[bytes]]:
    proc = _EARLY.pop((alias, command), None)
    if proc is not None:
        log.debug("%s: the early first contact answers this request", alias)
    return proc


def take_all_early() -> list[subprocess.Popen[bytes]]:
    """The early sessions nothing took (at exit: to be closed)."""
    return [proc for proc in (_EARLY.pop(k, None) for k in list(_EARLY)) if proc is not None]


def _first_line(stream: IO[bytes], deadline: float) -> bytes:
    """What the command wrote up to and including its first newline (more, if it came in
    the same read), or all of it if it ended first; waits no later than ``deadline``."""
    got = b""
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while b"\n" not in got:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise subprocess.TimeoutExpired("ssh", 0)
            part = os.read(stream.fileno(), 65536)
            if not part:
                break
            got += part
    return got


class _MasterWatch:
    """One ssh request's life: at its end the process is reaped, a timeout is the node's
    "no answer within". And while it runs: a request through a master whose node stops
    answering sees ServerAlive close the master within a few seconds, and ssh then quietly
    connects afresh, which waits ConnectTimeout more. So while a request runs past a second,
    a thread looks at the master every half second: one seen up, then gone, ends the request
    (the node judged). Quick requests, and requests with no master at all (ConnectTimeout
    bounds those), are never looked at."""

    FIRST_S = 1.0
    EVERY_S = 0.5

    def __init__(
        self, pool: OpenSshPool, alias: str, proc: subprocess.Popen[bytes], timeout: float
    ) -> None:
        self.pool = pool
        self.alias = alias
        self.proc = proc
        self.timeout = timeout
        self.fired = False
        self._done = threading.Event()

    def __enter__(self) -> _MasterWatch:
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, _kind: object, exc: Optional[BaseException], _tb: object) -> None:
        self._done.set()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise UnreachableError(f"{self.alias}: no answer within {self.timeout:.0f}s") from exc

    def _watch(self) -> None:
        seen = False
        if self._done.wait(self.FIRST_S):
            return
        while not self._done.is_set():
            alive = self.pool.master_alive(self.alias)
            if seen and not alive and not self._done.is_set():
                self.fired = True
                with contextlib.suppress(OSError):
                    self.proc.kill()
                return
            seen = seen or alive
            self._done.wait(self.EVERY_S)

    def raise_if_fired(self) -> None:
        if self.fired:
            raise UnreachableError(
                f"{self.alias}: the node stopped answering (its SSH connection timed out)"
            )
