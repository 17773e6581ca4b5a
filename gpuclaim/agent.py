"""The node agent: what must run *on* a node, driven by the CLI over SSH.

One request per process: a JSON object on stdin, a JSON object on stdout. Standard library
and Python 3.9 only, because nodes have whatever python3 their distribution ships; the CLI
sends this module and the few it needs as one zip (see ``remote/bundle.py``) and caches it
on the node by version.

Requests: ``{"op": "probe", ...}``, ``{"op": "doctor", ...}``, and
``{"op": "store", "root": PATH, "method": NAME, "args": {...}}`` which runs one claim-store
operation on this host, so laptops that do not mount the storage get the same atomic claims
and the storage host's clock.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gpuclaim import __version__
from gpuclaim.errors import GpuclaimError

if TYPE_CHECKING:
    from gpuclaim.store import ClaimStore

# Each request imports only what it needs: the agent starts once per request.

AGENT_PROTOCOL = 1


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request; errors of ours come back as data, never as a traceback."""
    op = request.get("op")
    handler = _OPS.get(str(op))
    if handler is None:
        return {"error": {"type": "GpuclaimError", "message": f"agent: unknown op {op!r}"}}
    try:
        return {"result": handler(request)}
    except GpuclaimError as exc:
        return {"error": {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}}
    except OSError as exc:
        return {"error": {"type": "StoreError", "message": f"{exc.strerror}: {exc.filename}"}}


def _probe(request: dict[str, Any]) -> dict[str, Any]:
    from gpuclaim.probe.local import probe_local

    inv = probe_local(
        str(request["node"]),
        tuple(request.get("nvidia_smi") or ()),
        dict(request.get("env") or {}),
        float(request.get("timeout", 10.0)),
        liveness=True,
    )
    return inv.to_dict()


def _doctor(request: dict[str, Any]) -> dict[str, Any]:
    """Facts about this node for ``gpuclaim doctor``; each check independent of the others."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "agent_version": __version__,
        "protocol": AGENT_PROTOCOL,
        "time": time.time(),
        "hostname": platform.node(),
    }
    tmux = shutil.which("tmux")
    facts["tmux"] = _version_of([tmux, "-V"]) if tmux else None
    facts["nvidia_smi"] = shutil.which("nvidia-smi")
    try:
        import pynvml  # noqa: F401

        facts["pynvml"] = True
    except ImportError:
        facts["pynvml"] = False
    facts["inventory"] = _probe(request) if request.get("node") else None
    root = request.get("storage")
    if root:
        facts["storage"] = _storage_facts(Path(str(root)))
    facts["time"] = time.time()  # last, so clock skew is not blurred by the probes above
    return facts


def _storage_facts(root: Path) -> dict[str, Any]:
    from gpuclaim.store import ClaimStore

    store = ClaimStore(root)
    try:
        # Looked at, never made here: an empty directory at the path is a node that does
        # not mount the shared storage, not a place for a store of its own.
        if not root.is_dir():
            return {"path": str(root), "ok": False, "error": f"{root} does not exist"}
        if not (root / "VERSION").exists():
            error = f"{root} holds no gpuclaim store (is the shared storage mounted there?)"
            return {"path": str(root), "ok": False, "error": error}
        refusal = store.writable()
        if refusal:
            return {"path": str(root), "ok": False, "error": refusal}
        return {"path": str(root), "ok": True, "time": store.now(), "id": store.store_id()}
    except GpuclaimError as exc:
        return {"path": str(root), "ok": False, "error": str(exc)}


def _version_of(argv: list[Any]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return (proc.stdout or proc.stderr).strip()


def _store(request: dict[str, Any]) -> Any:
    from gpuclaim.store import ClaimStore

    store = ClaimStore(Path(str(request["root"])))
    method = str(request["method"])
    args = dict(request.get("args") or {})
    from gpuclaim.store import PLAIN_METHODS

    if method in PLAIN_METHODS:
        return getattr(store, method)(**args)
    call = _STORE_METHODS.get(method)
    if call is None:
        raise GpuclaimError(f"agent: unknown store method {method!r}")
    return call(store, args)


def _claim(d: dict[str, Any]) -> Any:
    from gpuclaim.model import Claim

    return Claim.from_dict(d)


def _event(d: dict[str, Any]) -> Any:
    from gpuclaim.model import Event

    return Event.from_dict(d)


def _claim_file(d: dict[str, Any]) -> Any:
    from gpuclaim.store import ClaimFile

    return ClaimFile.from_dict(d)


_STORE_METHODS: dict[str, Callable[[ClaimStore, dict[str, Any]], Any]] = {
    "ensure": lambda s, a: s.ensure(create=bool(a.get("create"))),
    "now": lambda s, a: s.now(),
    "clock": lambda s, a: {"now": s.now(), "refusal": str(s.refusal) if s.refusal else None},
    "snapshot": lambda s, a: s.snapshot().to_dict(),
    "acquire": lambda s, a: s.acquire(_claim(a["claim"])),
    "remove_gpu": lambda s, a: s.remove_gpu(a["uuid"], a.get("claim_id"), inode=a.get("inode", 0)),
    "quarantine_corrupt": lambda s, a: s.quarantine_corrupt(_claim_file(a["file"])),
    "rewrite": lambda s, a: s.rewrite(_claim(a["old"]), _claim(a["new"])),
    "append_event": lambda s, a: s.append_event(_event(a["event"])),
    "read_events": lambda s, a: _events_result(s),
    "drains": lambda s, a: s.drains(),
    "set_drain": lambda s, a: s.set_drain(a["node"], a["info"]),
    "clear_drain": lambda s, a: s.clear_drain(a["node"]),
    "sweep": lambda s, a: s.sweep(),
}


def _events_result(store: ClaimStore) -> dict[str, Any]:
    events, bad = store.read_events()
    return {"events": [e.to_dict() for e in events], "bad": bad}


def _launch(request: dict[str, Any]) -> Any:
    from gpuclaim.runner import launch_rank

    return launch_rank(request["spec"])


def _keep_queue(request: dict[str, Any]) -> Any:
    from gpuclaim.queue_keeper import start_keeper

    return start_keeper(request["spec"])


def _stop_session(request: dict[str, Any]) -> Any:
    from gpuclaim.runner import stop_session

    return stop_session(str(request["session"]))


def _read_log(request: dict[str, Any]) -> Any:
    from gpuclaim.runner import read_log

    return read_log(
        str(request["path"]), int(request.get("offset", 0)), int(request.get("tail_lines", 0))
    )


def _node_facts(request: dict[str, Any]) -> Any:
    from gpuclaim.runner import node_facts

    return node_facts()


def _hardware(request: dict[str, Any]) -> Any:
    from gpuclaim.hardware import probe_hardware

    return probe_hardware()


def _notify_deliver(request: dict[str, Any]) -> Any:
    from gpuclaim.config import parse_config
    from gpuclaim.notify import deliver
    from gpuclaim.store import ClaimStore

    report = deliver(
        parse_config(request["config"]),
        ClaimStore(Path(str(request["root"]))),
        budget_s=float(request.get("budget", 2.0)),
    )
    return {"sent": report.sent, "pending": report.pending}


_OPS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "probe": _probe,
    "doctor": _doctor,
    "store": _store,
    "launch": _launch,
    "keep_queue": _keep_queue,
    "stop_session": _stop_session,
    "read_log": _read_log,
    "node_facts": _node_facts,
    "notify_deliver": _notify_deliver,
    "hardware": _hardware,
    "ping": lambda r: {"version": __version__, "time": time.time()},
}


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "wrap":
        from gpuclaim.runner import run_wrapper

        return run_wrapper(sys.argv[2])
    if len(sys.argv) == 3 and sys.argv[1] == "keep-queue":
        from gpuclaim.queue_keeper import run_keeper

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
