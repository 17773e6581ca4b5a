"""The fake nvidia-smi's "driver": one root process that sees every account's processes.

The real driver lists every account's compute apps; a look run by one account cannot read
another account's ``/proc/PID/environ`` (where a simulated job names its GPUs), so on a
testbed with several accounts this server, run as root, answers on a Unix socket what
:func:`fake_nvidia_smi.live_jobs` finds for the asking process (known by ``SO_PEERCRED``).
Run it as ``python3 -m gpuclaim.sim.sim_driver SOCKET``; looks find it through
``$GPUCLAIM_SIM_DRIVER``.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
from pathlib import Path

try:  # inside the package (tests) or copied alone beside it (a test node)
    from gpuclaim.sim import fake_nvidia_smi as smi
except ImportError:  # pragma: no cover - the copied layout
    import fake_nvidia_smi as smi  # type: ignore[import-not-found,no-redef]


def _answer(conn: socket.socket) -> None:
    with conn:
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            asker = struct.unpack("3i", creds)[0]
            ask = json.loads(conn.makefile("rb").readline())
            jobs = smi.live_jobs(str(ask["node"]), asker, ask.get("state"))
            conn.sendall(json.dumps(jobs).encode() + b"\n")
        except (OSError, ValueError, KeyError):
            pass


def serve(path: str) -> int:
    """Answer every look's question on ``path`` (mode 666: every account asks) until killed."""
    Path(path).unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    Path(path).chmod(0o666)
    server.listen(64)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_answer, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m gpuclaim.sim.sim_driver SOCKET")
    sys.exit(serve(sys.argv[1]))
