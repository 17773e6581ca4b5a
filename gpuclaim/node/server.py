"""The warm agent: the same ops as a one-shot agent, served by a process that stays up.

A look at a node used to cost an SSH session, a Python start and the probes' set-up (NVML's
init, on real GPUs the expensive part). The warm agent starts on demand (``serve-ensure``,
over one SSH command), then answers on a unix socket that the CLI reaches through its SSH
master (``ssh -O forward``), so a look costs one round trip. Per user, nothing to install:

- its socket and lock live in a private directory (``$XDG_RUNTIME_DIR/gpuclaim`` or
  ``~/.cache/gpuclaim/run-<host>``, 0700, ours; by host, as its where-file is, so nodes
  that share a home each have their own), and it answers only its own user (SO_PEERCRED);
- one per version (the socket is named by it); a newer one tells the others to quit if
  they are idle (two versions in use at once, one laptop upgraded before another, both stay);
- it exits by itself after ``idle_s`` without a request, removing its socket.

Protocol, one connection per caller: the server writes a greeting line, then answers each
request line (JSON) with one line. A caller that gets no greeting knows its request was never
read, so trying again cannot run it twice. Standard library only, Python 3.9.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.paths import socket_dir
from gpuclaim.node.agent import handle
from gpuclaim.node.recent_reads import RecentReads

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any, Optional

START_WAIT_S = 5.0  # serve-ensure waits this long for a server it started
RETIRE_IDLE_S = 30.0  # another version's server unused this long is retired by a new one
# The socket's name may use this many bytes: the directory is chosen for it, whatever the
# version (a socket path holds 107 bytes; agent-0.1.0-<12 hex>.sock is 29; longer ones
# are shortened to 32).
_NAME_MAX = 40


def runtime_dir() -> Path:
    """Private to this user: the runtime dir when there is one, else under the home, else
    (a path too long for a socket in it) a short one in /tmp, one per user and home."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    preferred = [Path(xdg) / "gpuclaim"] if xdg and Path(xdg).is_dir() else []
    # one per host: a home shared by every node (NFS) holds each node's socket apart
    preferred.append(Path.home() / ".cache" / "gpuclaim" / f"run-{host_key()}")
    return socket_dir(preferred, _NAME_MAX, "run", "the warm agent's socket")


def socket_path(version: str) -> Path:
    name = f"agent-{version}.sock"
    if len(name.encode()) > _NAME_MAX:  # a long local version: its name stays in budget
        import zlib

        name = f"agent-{zlib.crc32(version.encode()):08x}-{version[-12:]}.sock"
    return runtime_dir() / name


def greeting(version: str) -> dict[str, Any]:
    return {"agent": version, "pid": os.getpid()}


# -- the server ------------------------------------------------------------------------------
class Server:
    def __init__(self, version: str, idle_s: float) -> None:
        self.version = version
        self.idle_s = idle_s
        self.path = socket_path(version)
        self.last_request = time.monotonic()
        self.busy = 0
        self.stopping = threading.Event()
        self.recent = RecentReads(handle)
        self._lock = threading.Lock()

    def run(self) -> int:
        lock = open(self.path.with_suffix(".lock"), "a+")  # noqa: SIM115 - held while we live
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # another server of this version runs
        _retire_older(self.path.parent, self.path.name, self.idle_s)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket: its server is gone (we hold the lock)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        self.path.chmod(0o600)
        listener.listen(64)
        listener.settimeout(1.0)
        inode = self.path.stat().st_ino
        where = _say_where(self.version, self.path)
        code = _code_root()
        try:
            while not self.stopping.is_set() and not self._idle_too_long():
                try:
                    conn, _ = listener.accept()
                except socket.timeout:
                    if where is None or not where.exists():
                        # ~/.cache/gpuclaim removed under us (a clean-up, a reset). Our
                        # files with it: quit, or the wrappers we start could not run; the
                        # next look installs afresh. Else say where we are again, or every
                        # look would start an agent that finds this one and exits.
                        if not code.exists():
                            break
                        where = _say_where(self.version, self.path)
                    continue
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()
        finally:
            listener.close()
            with contextlib.suppress(OSError):
                if self.path.stat().st_ino == inode:
                    self.path.unlink()
            _unsay_where(where)
            lock.close()
        return 0

    def _idle_too_long(self) -> bool:
        with self._lock:
            return self.busy == 0 and time.monotonic() - self.last_request > self.idle_s

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if _peer_uid(conn) != os.getuid():
                return  # only our own user (the directory is private too)
            stream = conn.makefile("rwb")
            _send(stream, greeting(self.version))
            for line in stream:
                with self._lock:
                    idle_since, others = self.last_request, self.busy  # before this one
                    self.busy += 1
                    self.last_request = time.monotonic()
                try:
                    _send(stream, self._answer(line, idle_since, others))
                finally:
                    with self._lock:
                        self.busy -= 1
                        self.last_request = time.monotonic()
                if self.stopping.is_set():
                    return

    def _answer(self, line: bytes, idle_since: float = 0.0, others: int = 0) -> dict[str, Any]:
        try:
            request = json.loads(line.decode("utf-8"))
            if not isinstance(request, dict):
                raise ValueError("request must be a JSON object")
        except (ValueError, UnicodeDecodeError) as exc:
            return {"error": {"type": "GpuclaimError", "message": f"agent: bad request: {exc}"}}
        if request.get("op") == "quit":
            # "idle_for": only if nobody asked anything for that long (another version's
            # agent starting: a laptop of this version may be mid-look, or about to look)
            idle_for = float(request.get("idle_for") or 0.0)
            if idle_for and (others or time.monotonic() - idle_since < idle_for):
                return {"result": False}
            self.stopping.set()
            return {"result": True}
        if request.get("op") == "probe":
            return self.recent.answer(request)
        return handle(request)


def where_file(version: str) -> Path:
    """Where the server of ``version`` says its pid and socket, for a shell look at this node
    (``remote.shell_look``): next to the agent, a path ``sh`` finds without Python; named by
    the host, so that nodes sharing one home (NFS) each find their own agent."""
    return Path.home() / ".cache" / "gpuclaim" / f"agent-{version}@{host_key()}.where"


def host_key() -> str:
    """This host's name as the kernel has it (what the shell look reads without a fork)."""
    try:
        with open("/proc/sys/kernel/hostname", encoding="utf-8") as fh:
            name = fh.read().strip()
    except OSError:
        name = socket.gethostname()
    return name.replace("/", "_") or "localhost"  # as the shell reads it (no '/' in a name)


def _say_where(version: str, path: Path) -> Optional[Path]:
    """Write ``PID\nSOCKET\nSTART\n`` to the where-file (atomically; START: this process's
    start time, as its stat says it, so a look can tell this process from a later one that
    got its pid); None if it cannot be written (then shell looks start an agent each time,
    which finds this one and exits)."""
    from gpuclaim.core.liveness import process_start

    target = where_file(version)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(f"{os.getpid()}\n{path}\n{process_start(os.getpid())}\n", "utf-8")
        tmp.replace(target)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return target


def _code_root() -> Path:
    """Where this agent's code is: its directory or ``.pyz`` under ~/.cache/gpuclaim (a
    checkout, for a server started from one)."""
    import gpuclaim

    return Path(gpuclaim.__file__).parents[1]


def _unsay_where(target: Optional[Path]) -> None:
    with contextlib.suppress(OSError, ValueError):
        if target is not None and int(target.read_text("utf-8").split()[0]) == os.getpid():
            target.unlink()


def _send(stream: Any, message: dict[str, Any]) -> None:
    stream.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    stream.flush()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _retire_older(directory: Path, mine: str, idle_s: float) -> None:
    """Ask servers of other versions to quit if they are idle: another gpuclaim arrived, and
    the one it replaces is done with. One still in use (a lab upgrading one laptop at a time:
    two versions look at the node in turns) is left to run, and to exit once idle."""
    idle_for = min(RETIRE_IDLE_S, idle_s)
    for other in directory.glob("agent-*.sock"):
        if other.name != mine:
            with contextlib.suppress(OSError, ValueError):
                ask(other, {"op": "quit", "idle_for": idle_for}, timeout=2.0)


# -- a client on this node (serve-ensure, tests) --------------------------------------------
def ask(path: Path, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One request to the server at ``path``; OSError if none answers."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(path))
        stream = conn.makefile("rwb")
        _send(stream, request)
        hello = stream.readline()
        answer = stream.readline()
    if not hello or not answer:
        raise OSError(f"no answer from {path}")
    return dict(json.loads(answer))


def ensure(version: str, idle_s: float, entry: list[str], wait: bool = True) -> dict[str, Any]:
    """The socket of a running server of ``version``, starting one if there is none (without
    ``wait``: started, not waited for; the caller answers its request meanwhile)."""
    up = running(version)
    if up is not None:
        return up
    path = socket_path(version)
    import subprocess

    log = open(path.with_suffix(".log"), "ab")  # noqa: SIM115 - handed to the child
    try:
        subprocess.Popen(
            [*entry, "serve", version, str(idle_s)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives the SSH command that started it
            cwd=str(Path.home()),
        )
    finally:
        log.close()
    if not wait:
        return {"socket": str(path), "started": True}
    deadline = time.monotonic() + START_WAIT_S
    last: Optional[OSError] = None
    while time.monotonic() < deadline:
        try:
            ask(path, {"op": "ping"}, timeout=2.0)
            return {"socket": str(path), "started": True}
        except OSError as exc:
            last = exc
            time.sleep(0.02)
    raise GpuclaimError(f"the warm agent did not start: {last}")


def running(version: str) -> Optional[dict[str, Any]]:
    """The socket of a running server of ``version`` (it answered a ping), else None."""
    path = socket_path(version)
    try:
        ask(path, {"op": "ping"}, timeout=2.0)
    except OSError:
        return None
    return {"socket": str(path), "started": False}


def become_server(version: str, idle_s: float) -> None:
    """Fork this process into the warm agent, detached (own session, no terminal, its
    output to the log), and return in the parent. The one-shot agent that just answered has
    everything imported already: a fork costs far less than starting Python again."""
    path = socket_path(version)
    log = os.open(str(path.with_suffix(".log")), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        pid = os.fork()
    except OSError:
        os.close(log)
        raise
    if pid:
        os.close(log)
        return
    code = 1
    try:
        os.setsid()  # outlives the SSH session that started it
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)  # the SSH channel's pipes closed here: the session can end
        os.chdir(str(Path.home()))
        code = serve(version, idle_s)
    finally:
        os._exit(code)


def serve(version: str, idle_s: float) -> int:
    # NVML initialised once for the server's life: its init is the slow part of a probe.
    from gpuclaim.node.probe import nvml

    nvml.keep_initialised()
    server = Server(version, idle_s)
    # `kill` (a reinstall, a clean-up script) ends it as idleness does: socket and
    # where-file removed, so no look takes a dead socket for a live agent.
    import signal

    with contextlib.suppress(ValueError):  # not the main thread (a test's server)
        signal.signal(signal.SIGTERM, lambda *_: server.stopping.set())
    return server.run()


def serve_detached(version: str, idle_s: float) -> int:
    """``serve``, started in the background by a shell look (``sh`` cannot detach it): its
    own session, its output to the log next to its socket."""
    with contextlib.suppress(OSError):
        os.setsid()  # outlives the SSH session that started it
    try:
        log = os.open(
            str(socket_path(version).with_suffix(".log")),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
    except (OSError, GpuclaimError):
        return 1
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.chdir(str(Path.home()))
    return serve(version, idle_s)


def print_json(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, separators=(",", ":")) + "\n")
    sys.stdout.flush()
