"""Calling the node agent over SSH: one round trip per request once the agent is cached."""

from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any, Optional, Protocol

from gpuclaim.core.errors import UnreachableError, error_from_wire
from gpuclaim.remote.bundle import agent_bundle, agent_version
from gpuclaim.remote.ssh import CommandResult

if TYPE_CHECKING:
    from gpuclaim.remote.warm import WarmAgents

_MISSING = 117  # our sentinel exit status: the cached agent file is not on the node


class CommandRunner(Protocol):
    """An SSH transport: fabric's pool (``SshPool``) or the ssh binary (``OpenSshPool``)."""

    def run(
        self, alias: str, command: str, stdin: Optional[bytes] = None, timeout: float = 30.0
    ) -> CommandResult: ...


class AgentClient:
    """Sends JSON requests to ``python3 agent.pyz`` on a node (uploading it when missing),
    or to an installed ``agent_command`` when the config names one."""

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
        return self.run_agent(alias, "", json.dumps(request).encode(), timeout)

    def run_agent(self, alias: str, arguments: str, stdin: bytes, timeout: float) -> Any:
        """Run the one-shot agent (``python3 agent-dir ARGUMENTS``), installing it first
        when the node does not have this version; its ``result``."""
        return _result(self.run_agent_raw(alias, arguments, stdin, timeout))

    def run_agent_raw(
        self, alias: str, arguments: str, stdin: bytes, timeout: float
    ) -> dict[str, Any]:
        """The same, with the whole answer (the result or the error, and what else it says)."""
        command = self._command(arguments)
        result = self.pool.run(alias, command, stdin, timeout)
        if result.exit_code == _MISSING and self.agent_command is None:
            # One more round trip: the bundle and then the request on stdin, unpacked and
            # answered by one python3 (no separate unpack, no compileall).
            version, blob = agent_bundle()
            boot = _INSTALL_AND_RUN.encode()
            command = (
                f'c="$HOME/.cache/gpuclaim"; mkdir -p "$c" || exit {_CANNOT_INSTALL}; '
                f'exec python3 -c {shlex.quote(_LOADER)} {len(boot)} "$c/agent-{version}" '
                f"{arguments}"
            ).rstrip()
            framed = boot + f"{len(blob)}\n".encode() + blob + stdin
            result = self.pool.run(alias, command, framed, timeout)
            if result.exit_code == _CANNOT_INSTALL:
                raise UnreachableError(
                    f"{alias}: cannot install the gpuclaim agent in ~/.cache/gpuclaim: "
                    + _first_line(result.stderr)
                )
        return _response(alias, result.exit_code, result.stdout, result.stderr)

    def _command(self, arguments: str = "") -> str:
        if self.agent_command:
            return f"{self.agent_command} {arguments}".strip()
        path = f'"$HOME/.cache/gpuclaim/agent-{agent_version()}"'
        run = f'exec python3 "$d" {arguments}'.rstrip()
        return f'd={path}; [ -f "$d/__main__.py" ] || exit {_MISSING}; {run}'


_CANNOT_INSTALL = 118
# What the node's python3 (3.9+) runs as ``-c LOADER LENGTH AGENT_DIR ARGUMENTS...``: short,
# because it is what ``ps`` shows; it reads the installer below from stdin and runs it.
_LOADER = (
    "import os,sys\n"
    'n=int(sys.argv[1]);b=b""\n'
    "while len(b)<n:b+=os.read(0,n-len(b)) or sys.exit(1)\n"
    "exec(b)"
)
# The installer reads "LENGTH\n" and the zip from stdin with os.read (exactly, leaving the
# request after it unread), unpacks it into a temporary dir renamed into place (atomic: a
# racing install of the same version just loses), then runs the agent in this same
# interpreter (no second Python start, no compileall: the bundle carries bytecode).
_INSTALL_AND_RUN = """\
import sys
if sys.path and sys.path[0] == "":
    del sys.path[0]  # -c puts the current directory first; python3 DIR would not
import io, os, runpy, shutil, tempfile, zipfile
def take(n):
    got = b""
    while len(got) < n:
        part = os.read(0, n - len(got))
        if not part:
            sys.exit("the agent bundle was cut short")
        got += part
    return got
head = b""
while not head.endswith(b"\\n"):
    head += take(1)
blob = take(int(head))
agent = sys.argv[2]
cache = os.path.dirname(agent)
if not os.path.isfile(os.path.join(agent, "__main__.py")):
    try:
        tmp = tempfile.mkdtemp(prefix=".agent.", dir=cache)
        zipfile.ZipFile(io.BytesIO(blob)).extractall(tmp)
        for root, dirs, files in os.walk(tmp):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
            for f in files:
                os.chmod(os.path.join(root, f), 0o644)
        os.chmod(tmp, 0o755)
    except OSError as exc:
        sys.stderr.write("%s\\n" % exc)
        sys.exit(118)
    try:
        os.rename(tmp, agent)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
sys.argv = [agent] + sys.argv[3:]
runpy.run_path(agent, run_name="__main__")
"""


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
