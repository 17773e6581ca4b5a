"""Calling the node agent over SSH: one round trip per request once the agent is cached."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, Protocol

from gpuclaim.core.errors import UnreachableError, error_from_wire
from gpuclaim.core.lazylog import get_logger
from gpuclaim.remote import install
from gpuclaim.remote.bundle import agent_bundle, agent_version, bytecode_tag
from gpuclaim.remote.ssh import CommandResult

if TYPE_CHECKING:
    from gpuclaim.remote.warm import WarmAgents

log = get_logger(__name__)  # logging imported on first use


class CommandRunner(Protocol):
    """An SSH transport: fabric's pool (``SshPool``) or the ssh binary (``OpenSshPool``)."""

    def run(
        self, alias: str, command: str, stdin: Optional[bytes] = None, timeout: float = 30.0
    ) -> CommandResult: ...


class AgentClient:
    """Sends JSON requests to the agent in ``~/.cache/gpuclaim`` on a node (installing it
    when missing, ``remote.install``), or to an installed ``agent_command`` when the config
    names one."""

    def __init__(
        self,
        pool: CommandRunner,
        agent_command: Optional[str] = None,
        warm: Optional[WarmAgents] = None,
    ) -> None:
        self.pool = pool
        self.agent_command = agent_command
        self.warm = warm  # the node's warm agent, when the transport can reach one

    def call(self, alias: str, request: dict[str, Any], timeout: float = 30.0) -> Any:
        """The ``result`` of the request, or the agent's error raised as ours."""
        if self.warm is not None:
            answer = self.warm.call(alias, request, timeout)
            if answer is not None:
                if not isinstance(answer, dict):
                    raise UnreachableError(f"{alias}: the warm agent answered {answer!r}")
                return _result(answer)
        log.debug("%s: %s through a new SSH session (one-shot agent)", alias, request.get("op"))
        return self.run_agent(alias, "", json.dumps(request).encode(), timeout)

    def run_agent(self, alias: str, arguments: str, stdin: bytes, timeout: float) -> Any:
        """Run the one-shot agent (``install.run_command``), installing it first when the
        node does not have this version; its ``result``."""
        return _result(self.run_agent_raw(alias, arguments, stdin, timeout))

    def run_agent_raw(
        self, alias: str, arguments: str, stdin: bytes, timeout: float
    ) -> dict[str, Any]:
        """The same, with the whole answer (the result or the error, and what else it says)."""
        if self.agent_command:
            command = f"{self.agent_command} {arguments}".strip()
            result = self.pool.run(alias, command, stdin, timeout)
            return _response(alias, result.exit_code, result.stdout, result.stderr)
        version = agent_version()
        result = self.pool.run(alias, install.run_command(version, arguments), stdin, timeout)
        if result.exit_code == install.MISSING:
            # One more round trip: the request, the installer and the archive at once.
            framed = _line(stdin) + install.install_stdin(agent_bundle()[1])
            command = install.install_command(version, bytecode_tag(), arguments)
            result = self.pool.run(alias, command, framed, timeout)
        return self._answer(alias, result)

    def first_contact(
        self, alias: str, arguments: str, stdin: bytes, timeout: float
    ) -> dict[str, Any]:
        """``run_agent_raw`` for the first request to a node in a while (the warm agent not
        reached): one SSH session whether or not the node has this version, the archive sent
        only when the node asks for it (``install.install_command``)."""
        converse = getattr(self.pool, "converse", None)
        if self.agent_command or converse is None:
            return self.run_agent_raw(alias, arguments, stdin, timeout)
        command = install.install_command(agent_version(), bytecode_tag(), arguments)

        def then(first_line: bytes) -> Optional[bytes]:
            return install.install_stdin(agent_bundle()[1]) if first_line == install.NEED else None

        return self._answer(alias, converse(alias, command, _line(stdin), then, timeout))

    def _answer(self, alias: str, result: CommandResult) -> dict[str, Any]:
        if result.exit_code == install.CANNOT_INSTALL:
            raise UnreachableError(
                f"{alias}: cannot install the gpuclaim agent in ~/.cache/gpuclaim: "
                + _first_line(result.stderr)
            )
        return _response(alias, result.exit_code, result.stdout, result.stderr)


def _line(request: bytes) -> bytes:
    """The request as the one line the agent reads (JSON has no raw newlines)."""
    return request.rstrip(b"\n") + b"\n"


def _response(alias: str, code: int, stdout: bytes, stderr: bytes) -> dict[str, Any]:
    if code == 127:
        raise UnreachableError(f"{alias}: python3 is not installed (gpuclaim needs python3 >= 3.9)")
    text = stdout.decode("utf-8", "replace").strip()
    try:
        response = json.loads(text.splitlines()[-1]) if text else None
    except ValueError:
        response = None
    if not isinstance(response, dict):
        detail = _first_line(stderr) or text[:200] or f"exit status {code}"
        if "SyntaxError" in stderr.decode("utf-8", "replace"):
            detail = "python3 on the node is too old (gpuclaim needs >= 3.9)"
        raise UnreachableError(f"{alias}: agent failed: {detail}")
    return response


def _result(response: dict[str, Any]) -> Any:
    """The agent's ``result``, or its error raised as ours."""
    if "error" in response:
        raise error_from_wire(response["error"])
    return response.get("result")


def _first_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""
