"""The OpenSSH binary as transport, with ControlMaster multiplexing.

fabric keeps connections only for the life of a process; ``ssh`` with ``ControlPersist``
keeps one master per host between gpuclaim calls, so a command after the first costs one
round trip instead of a new key exchange, and no paramiko import. Host keys, ProxyJump,
Include and everything else are ssh's own handling of your ssh config.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Optional

from gpuclaim.core.errors import UnreachableError
from gpuclaim.core.paths import private_dir
from gpuclaim.remote.ssh import CommandResult
from gpuclaim.remote.ssh_messages import describe_ssh_failure

PERSIST = "10m"
log = logging.getLogger(__name__)


def control_dir() -> Path:
    """Where the master sockets live: private, and short, because a unix socket path must
    fit in 108 bytes and ``%C`` adds a 40-character hash."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache")
    path = base / "gpuclaim-cm"
    if len(str(path)) > 60:
        path = Path(tempfile.gettempdir()) / f"gpuclaim-cm-{os.getuid()}"
    return private_dir(path, "ssh sockets", UnreachableError)


class OpenSshPool:
    """Same interface as ``SshPool``: ``run(alias, command, stdin, timeout)``."""

    def __init__(self, ssh_config_path: Optional[Path] = None, connect_timeout: float = 5.0):
        binary = shutil.which("ssh")
        if binary is None:
            raise UnreachableError('ssh_client = "openssh" needs the ssh binary (openssh-client)')
        self.control_dir = control_dir()
        self.connect_timeout = max(1, round(connect_timeout))
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
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
        ]
        if ssh_config_path is not None:
            self.base += ["-F", str(ssh_config_path)]

    def run(
        self, alias: str, command: str, stdin: Optional[bytes] = None, timeout: float = 30.0
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                [*self.base, "--", alias, command],
                input=stdin or b"",
                capture_output=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise UnreachableError(f"{alias}: no answer within {timeout:.0f}s") from exc
        return self._result(alias, proc.returncode, proc.stdout, proc.stderr)

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
        try:
            assert proc.stdin is not None and proc.stdout is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(first)
            head = _first_line(proc.stdout, deadline)
            line, newline, _ = head.partition(b"\n")
            more = then(line + newline) if newline else None  # None: that was the answer
            left = max(0.1, deadline - time.monotonic())
            stdout, stderr = proc.communicate(more or b"", timeout=left)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.wait()
            raise UnreachableError(f"{alias}: no answer within {timeout:.0f}s") from exc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return self._result(alias, proc.returncode, head + stdout, stderr)

    def forget(self, alias: str) -> None:
        subprocess.run([*self.base, "-O", "exit", alias], capture_output=True, timeout=10)

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
