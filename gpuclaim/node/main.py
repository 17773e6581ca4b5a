"""The node's entry point (``python3 agent-dir`` or ``python -m gpuclaim.node.main``):

- ``wrap SPEC``: the job wrapper of one rank (started inside its tmux session);
- ``keep-queue SPEC``: the queue keeper of this node (started detached);
- ``serve-ensure VERSION IDLE``: the warm agent's socket, started if need be (``server``);
- ``serve-and VERSION IDLE``: one request answered here, the warm agent started meanwhile;
- ``serve VERSION IDLE``: the warm agent itself;
- otherwise one agent request: a JSON object on stdin, a JSON object on stdout.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from gpuclaim.node.agent import handle


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "wrap":
        from gpuclaim.node.wrapper import run_wrapper

        return run_wrapper(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "keep-queue":
        from gpuclaim.node.queue_keeper import run_keeper

        return run_keeper(sys.argv[2])
    if len(sys.argv) == 4 and sys.argv[1] in ("serve", "serve-ensure"):
        return _serve(sys.argv[1], sys.argv[2], float(sys.argv[3]))
    warm: dict[str, Any] = {}
    if len(sys.argv) == 4 and sys.argv[1] == "serve-and":
        warm = _start_warm(sys.argv[2], float(sys.argv[3]))
    raw = sys.stdin.buffer.read()
    try:
        request = json.loads(raw.decode("utf-8") or "{}")
        if not isinstance(request, dict):
            raise ValueError("request must be a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        response: dict[str, Any] = {
            "error": {"type": "GpuclaimError", "message": f"agent: bad request: {exc}"}
        }
    else:
        response = handle(request)
    if warm:
        response["warm"] = warm
    sys.stdout.write(json.dumps(response, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


def _start_warm(version: str, idle_s: float) -> dict[str, Any]:
    """Start this node's warm agent for the next requests (not waited for)."""
    from gpuclaim.core.errors import GpuclaimError
    from gpuclaim.node import server
    from gpuclaim.node.home import agent_entry

    try:
        return server.ensure(version, idle_s, agent_entry(), wait=False)
    except (GpuclaimError, OSError) as exc:
        return {"error": str(exc)}


def _serve(command: str, version: str, idle_s: float) -> int:
    from gpuclaim.core.errors import GpuclaimError, error_to_wire
    from gpuclaim.node import server

    if command == "serve":
        return server.serve(version, idle_s)
    from gpuclaim.node.home import agent_entry

    try:
        server.print_json({"result": server.ensure(version, idle_s, agent_entry())})
    except (GpuclaimError, OSError) as exc:
        server.print_json({"error": error_to_wire(exc)})
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
