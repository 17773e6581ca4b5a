"""SSH with fabric, made strict and bounded.

fabric accepts any host key (it sets ``AutoAddPolicy`` and never reads known_hosts), its
paramiko ignores ``Include`` in ssh_config (paramiko #1044), its connect can wait on a banner
for long, and its gateway (``ProxyJump``) hops are plain Connections again. This module fixes
each of those once: ssh_config with Includes expanded, known_hosts loaded and unknown or
changed keys refused as ``ssh`` would, timeouts on connect, banner, auth and every command,
and a pool that reuses one connection per host for the life of the process.
"""

from __future__ import annotations

import glob
import os
import pwd
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Optional

from gpuclaim.core.errors import UnreachableError

DEFAULT_CONNECT_TIMEOUT = 5.0
_MAX_INCLUDE_DEPTH = 16


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


def expand_includes(path: Path, base_dir: Path, depth: int = 0) -> str:
    """The text of an ssh_config with every ``Include`` replaced by the files it names
    (globs, ``~``, paths relative to ``base_dir`` as OpenSSH does), recursively."""
    if depth > _MAX_INCLUDE_DEPTH:
        raise UnreachableError(f"ssh config: Include nested deeper than {_MAX_INCLUDE_DEPTH}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UnreachableError(f"cannot read ssh config {path}: {exc.strerror}") from exc
    out = []
    for line in text.splitlines():
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].lower() == "include":
            for pattern in words[1].split():
                pattern = os.path.expanduser(pattern.strip('"'))
                if not os.path.isabs(pattern):
                    pattern = str(base_dir / pattern)
                for included in sorted(glob.glob(pattern)):
                    out.append(expand_includes(Path(included), base_dir, depth + 1))
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def config_for_ssh_binary(explicit: Optional[Path]) -> Optional[Path]:
    """What to give the ``ssh`` binary as ``-F`` so that it reads the config file gpuclaim's
    own SSH reads (``load_ssh_config``): ``explicit`` when set, else ``$HOME/.ssh/config``.
    ``ssh`` itself reads the passwd home's, so where ``$HOME`` is elsewhere (sudo -E, a
    container, a test) it needs telling; None where the two agree."""
    if explicit is not None:
        return explicit.expanduser()
    ours = Path("~/.ssh/config").expanduser()
    try:
        theirs: Optional[Path] = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "config"
    except KeyError:  # a uid without a passwd entry: ssh finds no home of its own
        theirs = None
    if theirs is not None and ours.resolve() == theirs.resolve():
        return None
    if ours.exists():
        return ours
    # we read only the system file then; -F alone keeps ssh from reading any other
    system = Path("/etc/ssh/ssh_config")
    return system if system.exists() else Path(os.devnull)


def load_ssh_config(explicit: Optional[Path]) -> Any:
    """A paramiko SSHConfig: ``explicit`` alone (like ``ssh -F``), else ~/.ssh/config then
    /etc/ssh/ssh_config (first value wins, as in OpenSSH)."""
    from paramiko import SSHConfig

    user_dir = Path("~/.ssh").expanduser()
    if explicit is not None:
        return SSHConfig.from_text(expand_includes(explicit.expanduser(), user_dir))
    parts = []
    for candidate, base in (
        (user_dir / "config", user_dir),
        (Path("/etc/ssh/ssh_config"), Path("/etc/ssh")),
    ):
        if candidate.exists():
            parts.append(expand_includes(candidate, base))
    return SSHConfig.from_text("\n".join(parts))


@cache
def _connection_class(timeout: float) -> Any:
    """Defined lazily: importing fabric costs ~150 ms, which commands without SSH never pay.
    ``timeout`` bounds connect, banner and auth of the node and of every gateway hop."""
    import paramiko
    from fabric import Connection

    class CheckedConnection(Connection):  # type: ignore[misc]
        """A fabric Connection that checks host keys like ``ssh`` and hops through checked
        gateways."""

        def __init__(self, host: str, **kwargs: Any) -> None:
            super().__init__(host, **kwargs)
            strict = str(self.ssh_config.get("stricthostkeychecking", "yes")).lower()
            keys = self.client.get_host_keys()
            for path in _known_hosts_files(self.ssh_config):
                try:
                    keys.load(path)
                except (OSError, paramiko.SSHException):
                    continue
            if strict in ("no", "off", "accept-new"):
                # Unknown keys are accepted (not saved); a *changed* key is still refused.
                self.client.set_missing_host_key_policy(paramiko.WarningPolicy())
            else:
                self.client.set_missing_host_key_policy(paramiko.RejectPolicy())

        def get_gateway(self) -> Any:
            if "proxyjump" not in self.ssh_config:
                return super().get_gateway()
            gateway = None
            for hop in reversed(self.ssh_config["proxyjump"].split(",")):
                if self.derive_shorthand(hop)["host"] == self.host:
                    return None
                # Called from fabric's __init__, before our own attributes exist.
                kwargs: dict[str, Any] = {
                    "config": self.config.clone(),
                    "connect_timeout": timeout,
                    "connect_kwargs": {"banner_timeout": timeout, "auth_timeout": timeout},
                }
                if gateway is not None:
                    kwargs["gateway"] = gateway
                gateway = type(self)(hop, **kwargs)
            return gateway

    return CheckedConnection


def _known_hosts_files(ssh_config: Any) -> list[str]:
    files = []
    user = ssh_config.get("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2")
    system = ssh_config.get(
        "globalknownhostsfile", "/etc/ssh/ssh_known_hosts /etc/ssh/ssh_known_hosts2"
    )
    for entry in f"{user} {system}".split():
        path = os.path.expanduser(entry.strip('"'))
        if path != "/dev/null" and os.path.isfile(path):
            files.append(path)
    return files


class SshPool:
    """One checked, reused connection per host alias; safe to use from many threads."""

    def __init__(
        self,
        ssh_config_path: Optional[Path] = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        self.ssh_config_path = ssh_config_path
        self.connect_timeout = connect_timeout
        self._fabric_config: Any = None
        self._conns: dict[str, Any] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _config(self) -> Any:
        if self._fabric_config is None:
            from fabric import Config

            self._fabric_config = Config(
                ssh_config=load_ssh_config(self.ssh_config_path), lazy=True
            )
        return self._fabric_config

    def connection(self, alias: str) -> Any:
        """A connected Connection to ``alias``; raises UnreachableError with the reason."""
        with self._guard:
            lock = self._locks.setdefault(alias, threading.Lock())
        with lock:
            conn = self._conns.get(alias)
            if conn is not None and conn.is_connected:
                return conn
            timeout = self.connect_timeout
            # invoke's Config merges lazily and is not thread-safe: a fan-out's threads
            # building connections from one Config at once saw it half-merged ("No attribute
            # or config key found for 'user'"). Each connection gets its own copy, made and
            # read under the guard; only the network part (open) runs in parallel.
            with self._guard:
                conn = _connection_class(timeout)(
                    alias,
                    config=self._config().clone(),
                    connect_timeout=timeout,
                    connect_kwargs={"banner_timeout": timeout, "auth_timeout": timeout},
                )
            try:
                conn.open()
            except Exception as exc:
                reason = describe_ssh_error(exc)
                if _banner_missing(conn):
                    reason = f"no SSH banner within {timeout:g}s (sshd hung, or the node is)"
                _close_quietly(conn)
                raise UnreachableError(f"{alias}: {reason}") from exc
            self._conns[alias] = conn
            return conn

    def run(
        self, alias: str, command: str, stdin: Optional[bytes] = None, timeout: float = 30.0
    ) -> CommandResult:
        """Run ``command`` through the remote login shell; bounded by ``timeout`` seconds.
        A pooled connection that died since its last use is replaced once."""
        for attempt in (1, 2):
            conn = self.connection(alias)
            try:
                return _exec(conn, command, stdin, timeout)
            except _StaleConnection:
                self.forget(alias)
                if attempt == 2:
                    raise UnreachableError(f"{alias}: connection lost") from None
        raise AssertionError("not reached: the second attempt returns or raises")

    def forget(self, alias: str) -> None:
        conn = self._conns.pop(alias, None)
        if conn is not None:
            _close_quietly(conn)

    def close(self) -> None:
        for alias in list(self._conns):
            self.forget(alias)


class _StaleConnection(Exception):
    pass


def _exec(conn: Any, command: str, stdin: Optional[bytes], timeout: float) -> CommandResult:
    import socket

    import paramiko

    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise _StaleConnection()
    try:
        chan = transport.open_session(timeout=timeout)
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise _StaleConnection() from exc
    deadline = time.monotonic() + timeout
    try:
        chan.settimeout(timeout)
        chan.exec_command(command)
        try:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
        except OSError:
            pass  # the command exited without reading its input: its exit status says why
        stdout = _read_all(chan.recv, deadline)
        stderr = _read_all(chan.recv_stderr, deadline)
        if not chan.status_event.wait(max(0.0, deadline - time.monotonic())):
            raise UnreachableError(
                f"{conn.original_host}: command did not finish in {timeout:.0f}s"
            )
        if chan.exit_status == -1 and not _still_connected(transport):
            # The connection died under the command (node rebooted, sshd killed): no exit
            # status came. Reconnect once, so the caller hears why (e.g. refused).
            raise _StaleConnection()
        return CommandResult(chan.exit_status, stdout, stderr)
    except (socket.timeout, TimeoutError) as exc:
        raise UnreachableError(f"{conn.original_host}: no answer within {timeout:.0f}s") from exc
    except (paramiko.SSHException, EOFError, OSError) as exc:
        raise UnreachableError(f"{conn.original_host}: {describe_ssh_error(exc)}") from exc
    finally:
        chan.close()


def _still_connected(transport: Any, grace_s: float = 0.5) -> bool:
    """Whether the connection survived; its reader thread notices a dead peer a moment late."""
    end = time.monotonic() + grace_s
    while time.monotonic() < end:
        if not transport.is_active():
            return False
        time.sleep(0.05)
    return bool(transport.is_active())


def _read_all(recv: Any, deadline: float) -> bytes:
    chunks: list[bytes] = []
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError()
        data = recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def describe_ssh_error(exc: BaseException) -> str:
    """One line a person can act on, for the usual ways SSH fails."""
    import socket

    import paramiko

    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"HOST KEY CHANGED for {exc.hostname}: refusing to connect (if the node was "
            "reinstalled, remove the old key with ssh-keygen -R)"
        )
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return (
            f"unknown host key ({exc}); connect once with ssh to check and accept it, "
            "or add it with ssh-keyscan"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed ({exc})"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused (is sshd running?)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "connection timed out"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


def _banner_missing(conn: Any) -> bool:
    """The TCP connection was accepted but the server never said who it is: paramiko then
    fails with whatever step came next ('No existing session', 'Error reading ... banner')."""
    client = getattr(conn, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is not None and not transport.remote_version


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass
