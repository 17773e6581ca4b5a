"""Requests to each node's warm agent (``gpuclaim.node.server``) through the SSH master.

The first request to a node goes, as ever, to the one-shot agent over one SSH command, which
also starts the node's warm agent (``serve-and``); then the master is asked to forward a local
unix socket to the warm agent's (``ssh -O forward -L``, a local request to the master). Later
requests, from this process or the next command, connect to that local socket: one round trip
over the master's connection, no process started anywhere. A first call costs what it did.

Every failure falls back to the one-shot agent over SSH, only slower: no forwarding allowed
(``AllowStreamLocalForwarding no``), an agent that cannot start, a master that died (the
socket is then replaced). A request is sent again only when the agent provably never read
it (no greeting came back), so nothing runs twice.

Jobs start through it too (``launch``: one round trip instead of an SSH session and a Python
start, ~50 ms of every ``run``). What a job inherits is the same either way: the warm agent
is a fork of the one-shot agent of an earlier session over the same master, and the job's
wrapper reads the login shell's environment afresh (``node.workenv``); a forwarded SSH agent
socket that closed since is left out (``node.tmux``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from gpuclaim.core.digests import sha1_hex
from gpuclaim.core.errors import AnswerLostError, UnreachableError
from gpuclaim.core.lazylog import get_logger
from gpuclaim.core.paths import private_dir
from gpuclaim.remote import bundle, install
from gpuclaim.remote.openssh import OpenSshPool
from gpuclaim.remote.shell_look import look_command, parse_look

log = get_logger(__name__)  # logging imported on first use

OFF_FOR_S = 600.0  # after a node's warm path failed: the one-shot agent for this long

# Agents to install in the background, and being installed, by alias (one at a time per
# node per process); a look's fan-out is done long before INSTALL_AFTER_S.
INSTALL_AFTER_S = 3.0
_PENDING: dict[str, tuple[OpenSshPool, str, bytes]] = {}
_INSTALLING: dict[str, subprocess.Popen[bytes]] = {}
_INSTALLS_GUARD = threading.Lock()
_INSTALL_REQUEST = json.dumps({"op": "ping"}).encode()  # what the installed agent answers


def _start_installs() -> None:
    with _INSTALLS_GUARD:
        # one spawn per (pool, command, input): in practice one for all the nodes
        groups: dict[tuple[OpenSshPool, str, bytes], list[str]] = {}
        for alias, job in _PENDING.items():
            groups.setdefault(job, []).append(alias)
        _PENDING.clear()
        for (pool, command, request), aliases in groups.items():
            try:
                # here, not in the look: a new version's first call builds its bundle
                # (~0.3 s) after the command said what it had to say
                stdin = bundle.install_input(request)
            except OSError as exc:  # a read-only home: the next request's agent installs it
                log.debug("no background install on %s (%s)", ", ".join(aliases), exc)
                continue
            with contextlib.suppress(OSError):
                started = pool.start_detached(aliases, command, stdin)
                _INSTALLING.update(dict.fromkeys(aliases, started))
                log.debug("installing the agent in the background on %s", ", ".join(aliases))


def first_contact_arguments(version: str, idle_s: float) -> str:
    """The one-shot agent's arguments when no warm agent answered: answer, then become one."""
    return f"serve-and {version} {idle_s:g}"


class _NotSent(Exception):
    """The agent never read the request: trying again is safe."""


class _NoGreeting(_NotSent):
    """The forwarded socket took the connection, then closed it: no agent behind it, or the
    node's sshd refuses to forward to one."""


class WarmAgents:
    """``call`` answers through the node's warm agent, or None: use the one-shot agent."""

    def __init__(
        self,
        pool: OpenSshPool,
        version: str,
        idle_s: float,
        one_shot: Callable[[str, str, bytes, float], dict[str, Any]],
    ) -> None:
        self.pool = pool
        self.version = version
        self.idle_s = idle_s
        # (alias, agent arguments, stdin, timeout) -> the one-shot agent's whole answer
        self._one_shot = one_shot
        self._dir = private_dir(pool.control_dir / "w", "forwarded agent sockets")

    # -- paths ------------------------------------------------------------------------------
    def _key(self, alias: str) -> str:
        # the ssh config too: one alias may name other hosts in two configs, as ssh's %C knows
        where = str(self.pool.ssh_config_path or "")
        return sha1_hex(f"{alias}\0{where}".encode())[:12]

    def local_socket(self, alias: str) -> Path:
        return self._dir / f"w-{self._key(alias)}-{self.version[-12:]}.sock"

    def _off_file(self, alias: str) -> Path:
        return self._dir / f"w-{self._key(alias)}.off"

    def path_of(self, alias: str) -> str:
        """How requests reach ``alias`` now, in words (doctor)."""
        off = self._off_reason(alias)
        if off is not None:
            return f"one-shot agent per request (warm agent off: {off})"
        return "warm agent through the SSH master"

    def wants_first_contact(self, alias: str) -> bool:
        """Whether a call to ``alias`` now would open a first-contact session: its warm
        path is on, and no forwarded socket is there (``remote.early`` starts those)."""
        return self._off_reason(alias) is None and not self.local_socket(alias).exists()

    def first_contact_guards(self, alias: str) -> list[str]:
        """Paths whose presence says a call to ``alias`` may not want a first contact (its
        forwarded socket, its off mark): a kept plan (``remote.early_plan``) spawns none then."""
        return [str(self.local_socket(alias)), str(self._off_file(alias))]

    def _off_reason(self, alias: str) -> Optional[str]:
        path = self._off_file(alias)
        try:
            if time.time() - path.stat().st_mtime < OFF_FOR_S:
                return path.read_text("utf-8").strip() or "no reason recorded"
        except OSError:
            return None
        with contextlib.suppress(OSError):
            path.unlink()
        return None

    def _turn_off(self, alias: str, why: str) -> None:
        with contextlib.suppress(OSError):
            self._off_file(alias).write_text(why[:300] + "\n", "utf-8")

    # -- requests ---------------------------------------------------------------------------
    def call(self, alias: str, request: dict[str, Any], timeout: float) -> Optional[Any]:
        on = self._off_reason(alias) is None
        local = self.local_socket(alias)
        if on:
            try:
                return self._ask(alias, local, request, timeout)
            except _NotSent as exc:
                log.debug("%s: no warm agent answered (%s)", alias, exc)
        if request.get("op") == "probe":
            looked = self._shell_look(alias, request, timeout, forward=on)
            if looked is not None:
                return looked
        if not on:
            return None
        # No warm agent behind the socket (yet, or any more): this request goes to the
        # one-shot agent, which starts the warm one meanwhile; the next ones go warm.
        payload = json.dumps(request).encode()
        arguments = first_contact_arguments(self.version, self.idle_s)
        answer = self._one_shot(alias, arguments, payload, timeout)
        warm = answer.pop("warm", None) or {}
        if "socket" not in warm:
            self._turn_off(alias, str(warm.get("error") or "the node did not start one"))
            return answer
        # It was up, so the forward should reach it now: if not, it never will.
        self._forward_checked(alias, str(warm["socket"]), timeout, warm.get("started") is False)
        return answer

    def _shell_look(
        self, alias: str, request: dict[str, Any], timeout: float, forward: bool
    ) -> Optional[dict[str, Any]]:
        """A look with no Python started on the node (``remote.shell_look``); None where the
        node needs the agent's own (no nvidia-smi on its PATH, a shell that is not sh)."""
        command = look_command(self.version, self.idle_s, request)
        result = self.pool.run(alias, command, None, timeout)
        look = parse_look(result.stdout, result.stderr, request)
        if look is not None and look.cannot:
            # as the agent's own install says it: jobs could not start there either
            raise UnreachableError(
                f"{alias}: cannot install the gpuclaim agent in ~/.cache/gpuclaim: {look.cannot}"
            )
        if look is None or look.inventory is None:
            log.debug("%s: the shell look cannot answer: the agent's look", alias)
            return None
        log.debug("%s: looked with sh (warm agent: %s)", alias, look.agent)
        if look.agent == "missing":
            self._install_in_background(alias)
        elif look.agent == "warm" and forward:
            with contextlib.suppress(UnreachableError):
                self._forward_checked(alias, look.socket, timeout, check=True)
        return {"result": look.inventory}

    def _install_in_background(self, alias: str) -> None:
        """Send this version's agent to ``alias`` and start it, once this command has said
        what it has to say (``_start_installs``: at exit, or a few seconds on in a process
        that lives on, such as the board), and beyond it: the next look finds it warm."""
        arguments = first_contact_arguments(self.version, self.idle_s)
        command = install.install_command(self.version, bundle.bytecode_tag(), arguments)
        with _INSTALLS_GUARD:
            running = _INSTALLING.get(alias)
            if running is not None and running.poll() is None:
                return
            if not _PENDING:
                atexit.register(_start_installs)
                timer = threading.Timer(INSTALL_AFTER_S, _start_installs)
                timer.daemon = True
                timer.start()
            _PENDING[alias] = (self.pool, command, _INSTALL_REQUEST)

    def _forward_checked(self, alias: str, remote: str, timeout: float, check: bool) -> None:
        """Forward the local socket to the agent's ``remote`` one; with ``check``, ask it once
        (an agent known up that does not answer means forwarding is refused: warm path off)."""
        local = self.local_socket(alias)
        try:
            self._forward(alias, local, remote, timeout)
            if check:
                self._ask(alias, local, {"op": "ping"}, timeout)
        except _NotSent as exc:
            why = str(exc)
            if isinstance(exc, _NoGreeting) or not local.exists():
                why = "the node's sshd refuses to forward to it (AllowStreamLocalForwarding no?)"
            self._turn_off(alias, why)

    def _ask(self, alias: str, local: Path, request: dict[str, Any], timeout: float) -> Any:
        if not local.exists():  # a first call: no agent to ask yet, and no socket import
            raise _NotSent(f"no forwarded socket {local}")
        import socket

        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # The greeting is the node's "I am here": it comes within a round trip, however
            # long the request takes. A node that stops answering is judged by it, in
            # connect_timeout as on a fresh connection, not at the end of the deadline.
            greeting_s = min(timeout, self.pool.connect_timeout)
            conn.settimeout(greeting_s)
            try:
                conn.connect(str(local))
            except OSError as exc:  # no socket yet, or its master is gone
                raise _NotSent(str(exc)) from exc
            stream = conn.makefile("rwb")
            try:
                # The request goes only after the greeting: never into a node that stopped
                # answering (it would run it when it thaws, after we said it failed). It
                # costs no round trip: the master sends nothing before the channel is open,
                # and the agent greets as the channel opens.
                hello = stream.readline()
            except socket.timeout as exc:
                # Judged for this command; the master is left alone (other requests, a long
                # rsync, may be using it): if its node is gone, ServerAlive closes it.
                raise UnreachableError(
                    f"{alias}: no answer within {greeting_s:.0f}s (the node stopped answering)"
                ) from exc
            except ConnectionResetError:
                hello = b""  # the master took the connection, then dropped it
            except OSError as exc:
                raise _NotSent(str(exc)) from exc
            if not hello:
                if not self.pool.master_alive(alias):
                    # It was up when we connected and went while we waited: ServerAlive
                    # found its node not answering. A fresh connection would only wait
                    # ConnectTimeout more; the next command tries one.
                    raise UnreachableError(
                        f"{alias}: the node stopped answering (its SSH connection timed out)"
                    )
                raise _NoGreeting("the forwarded socket closed: no agent behind it")
            try:
                stream.write(json.dumps(request, separators=(",", ":")).encode() + b"\n")
                stream.flush()
            except OSError as exc:
                raise UnreachableError(f"{alias}: the agent went away: {exc}") from exc
            conn.settimeout(timeout)
            try:
                answer = stream.readline()
            except socket.timeout as exc:  # it was sent: the node may have done it
                raise AnswerLostError(f"{alias}: no answer within {timeout:.0f}s") from exc
            if not answer:
                raise AnswerLostError(f"{alias}: the agent went away during the request")
            return json.loads(answer)
        finally:
            conn.close()

    def _forward(self, alias: str, local: Path, remote: str, timeout: float) -> None:
        """Ask the SSH master to forward ``local`` to the warm agent's socket on the node."""
        for old in self._dir.glob(f"w-{self._key(alias)}-*.sock"):
            with contextlib.suppress(OSError):
                old.unlink()  # a dead master's socket, or another version's
        spec = f"{local}:{remote}"
        proc = self._master(alias, "forward", spec, timeout)
        if proc.returncode == 0 and not local.exists():
            # The master still holds this forwarding (its agent went away and came back,
            # or the socket file was removed): it answers "done" without making the
            # socket again. Cancel it and forward anew.
            self._master(alias, "cancel", spec, timeout)
            proc = self._master(alias, "forward", spec, timeout)
        if proc.returncode != 0:
            reason = (proc.stderr.strip().splitlines() or ["ssh -O forward failed"])[-1]
            raise _NotSent(f"the SSH master cannot forward to it: {reason}")

    def _master(
        self, alias: str, command: str, spec: str, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.pool.base, "-O", command, "-L", spec, "--", alias],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
