"""The node's entry point (``python3 agent-dir`` or ``python -m gpuclaim.node.main``):

- ``wrap SPEC``: the job wrapper of one rank (started inside its tmux session);
- ``keep-queue SPEC``: the queue keeper of this node (started detached);
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
    sys.stdout.write(json.dumps(response, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
