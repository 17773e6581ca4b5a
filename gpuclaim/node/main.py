"""The node's entry point (``python3 agent-dir`` or ``python -m gpuclaim.node.main``):

- ``wrap SPEC``: the job wrapper of one rank (started inside its tmux session);
- ``keep-queue SPEC``: the queue keeper of this node (started detached);
- ``build-spare KEY JOB``: the spare tree for a project's next ``--sync`` (started detached);
- ``serve-ensure VERSION IDLE``: the warm agent's socket, started if need be (``server``);
- ``serve-and VERSION IDLE``: one request answered here, then this process becomes the warm
  agent (forked, detached) if none runs;
- ``serve VERSION IDLE``: the warm agent itself (``serve-detached``: in its own session,
  its output to its log: as a shell look starts it, ``remote.shell_look``);
- otherwise one agent request: a JSON object on stdin, a JSON object on stdout.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any

    from gpuclaim.core.protocol import OpName


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "wrap":
        from gpuclaim.node.wrapper import run_wrapper

        return run_wrapper(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "keep-queue":
        from gpuclaim.node.queue_keeper import run_keeper

        return run_keeper(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] == "build-spare":
        from gpuclaim.node.copies import build_spare

        build_spare(sys.argv[2], sys.argv[3])
        return 0
    if len(sys.argv) == 4 and sys.argv[1] in ("serve", "serve-ensure", "serve-detached"):
        return _serve(sys.argv[1], sys.argv[2], float(sys.argv[3]))
    warm: dict[str, Any] = {}
    fork = False
    if len(sys.argv) == 4 and sys.argv[1] == "serve-and":
        warm, fork = _warm_agent(sys.argv[2])
    raw = sys.stdin.buffer.readline()  # one line: the caller may keep stdin open
    request: Any = None
    try:
        request = json.loads(raw.decode("utf-8") or "{}")
        if not isinstance(request, dict):
            raise ValueError("request must be a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        response: dict[str, Any] = {
            "error": {"type": "GpuclaimError", "message": f"agent: bad request: {exc}"}
        }
    else:
        from gpuclaim.node.agent import handle  # here: a job's wrapper never needs it

        response = handle(request)
    if warm:
        response["warm"] = warm
    sys.stdout.write(json.dumps(response, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    if fork:
        from gpuclaim.node import server

        try:
            server.become_server(sys.argv[2], float(sys.argv[3]))
        except OSError:
            pass  # no fork (no memory, a process limit): the next request starts one
    if isinstance(request, dict) and request.get("op") in _READ_ONLY:
        # Nothing left to flush or clean up: skip tearing the interpreter down (a few ms of
        # every first look at a node, where the CPU is the user's wait).
        sys.stderr.flush()
        os._exit(0)
    return 0


_READ_ONLY: frozenset[OpName] = frozenset({"probe", "ping", "node_facts", "hardware"})


def _warm_agent(version: str) -> tuple[dict[str, Any], bool]:
    """This node's warm agent for the next requests: (what to tell the caller, whether this
    process must become it once it has answered)."""
    from gpuclaim.core.errors import GpuclaimError
    from gpuclaim.node import server

    try:
        up = server.running(version)
        if up is not None:
            return up, False
        return {"socket": str(server.socket_path(version)), "started": True}, True
    except (GpuclaimError, OSError) as exc:
        return {"error": str(exc)}, False


def _serve(command: str, version: str, idle_s: float) -> int:
    from gpuclaim.core.errors import GpuclaimError, error_to_wire
    from gpuclaim.node import server

    if command == "serve":
        return server.serve(version, idle_s)
    if command == "serve-detached":
        return server.serve_detached(version, idle_s)
    from gpuclaim.node.home import agent_entry

    try:
        server.print_json({"result": server.ensure(version, idle_s, agent_entry())})
    except (GpuclaimError, OSError) as exc:
        server.print_json({"error": error_to_wire(exc)})
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
