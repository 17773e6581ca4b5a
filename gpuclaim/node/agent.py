"""The node agent: what must run *on* a node, driven by the CLI over SSH.

One request per process: a JSON object on stdin, a JSON object on stdout. Standard library
and Python 3.9 only, because nodes have whatever python3 their distribution ships; the CLI
sends this module and the few it needs as one zip (see ``remote/bundle.py``) and caches it
on the node by version.

Requests: ``{"op": "probe", ...}``, ``{"op": "doctor", ...}``, and
``{"op": "store", "root": PATH, "method": NAME, "args": {...}}`` which runs one claim-store
operation on this host, so laptops that do not mount the storage get the same atomic claims
and the storage host's clock.

Each op's request and response are typed in ``gpuclaim.core.protocol`` (imported here to
type-check only: at runtime they are the JSON's plain dicts).
"""

from __future__ import annotations

import time
from pathlib import Path

from gpuclaim import __version__
from gpuclaim.core.errors import GpuclaimError, error_to_wire

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any, Callable, Optional

    from gpuclaim.core import protocol

# Each request imports only what it needs: the agent starts once per request, and a first
# look at a node pays every import (platform, shutil, subprocess: only for the ops using them).

AGENT_PROTOCOL = 1


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request; errors of ours come back as data, never as a traceback."""
    op = request.get("op")
    handler = _OPS.get(str(op))
    if handler is None:
        return {"error": {"type": "GpuclaimError", "message": f"agent: unknown op {op!r}"}}
    try:
        return {"result": handler(request)}
    except (GpuclaimError, OSError) as exc:
        return {"error": error_to_wire(exc)}
    except (KeyError, TypeError, ValueError) as exc:  # a request missing or mistyping a field
        message = f"agent: bad {op} request: {type(exc).__name__}: {exc}"
        return {"error": {"type": "GpuclaimError", "message": message}}


def _probe(request: protocol.ProbeRequest) -> protocol.ProbeResponse:
    from gpuclaim.node.probe.local import probe_local

    inv = probe_local(
        str(request["node"]),
        tuple(request["nvidia_smi"]),
        dict(request["env"]),
        float(request["timeout"]),
        liveness=True,
    )
    return inv.to_dict()


def _doctor(request: protocol.DoctorRequest) -> protocol.DoctorResponse:
    """Facts about this node for ``gpuclaim doctor``; each check independent of the others."""
    import platform
    import shutil

    facts: protocol.DoctorResponse = {
        "python": platform.python_version(),
        "agent_version": __version__,
        "protocol": AGENT_PROTOCOL,
        "time": time.time(),
        "hostname": platform.node(),
        "tmux": _tmux_version(shutil.which("tmux")),
        "nvidia_smi": shutil.which("nvidia-smi"),
        "pynvml": _has_pynvml(),
        "inventory": _probe(request) if request["node"] else None,
    }
    inventory = facts["inventory"]
    if inventory:
        from gpuclaim.node.probe.persistence import persistence_off

        facts["persistence_off"] = persistence_off(
            str(inventory.get("source")),
            tuple(request["nvidia_smi"]),
            dict(request["env"]),
        )
    root = request["storage"]
    if root:
        facts["storage"] = _storage_facts(Path(str(root)))
    facts["time"] = time.time()  # last, so clock skew is not blurred by the probes above
    return facts


def _tmux_version(tmux: Optional[str]) -> Optional[str]:
    return _version_of([tmux, "-V"]) if tmux else None


def _has_pynvml() -> bool:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return False
    return True


def _storage_facts(root: Path) -> protocol.StorageFacts:
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
    import subprocess

    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"error: {exc}"
    return (proc.stdout or proc.stderr).strip()


def _store(request: protocol.StoreRequest) -> protocol.StoreResponse:
    """One method of the store's interface (``gpuclaim.store.interface.Store``), run here."""
    from gpuclaim.store import STORE_CODEC, STORE_METHODS, ClaimStore

    method = str(request["method"])
    if method not in STORE_METHODS:
        raise GpuclaimError(f"agent: unknown store method {method!r}")
    store = ClaimStore(Path(str(request["root"])))
    args = STORE_CODEC.decode(request["args"])
    kwargs = STORE_CODEC.decode(request["kwargs"])
    return STORE_CODEC.encode(getattr(store, method)(*args, **kwargs))


def _launch(request: protocol.LaunchRequest) -> protocol.LaunchResponse:
    from gpuclaim.node.runner import launch_rank

    return launch_rank(request["spec"])


def _keep_queue(request: protocol.KeepQueueRequest) -> protocol.KeepQueueResponse:
    from gpuclaim.node.home import start_keeper

    return start_keeper(request["spec"])


def _stop_session(request: protocol.StopSessionRequest) -> protocol.StopSessionResponse:
    from gpuclaim.node.runner import stop_session

    return stop_session(str(request["session"]))


def _read_log(request: protocol.ReadLogRequest) -> protocol.ReadLogResponse:
    from gpuclaim.node.runner import read_log

    return read_log(
        str(request["path"]),
        int(request["offset"]),
        int(request["tail_lines"]),
        wait_s=float(request["wait_s"]),
    )


def _node_facts(request: protocol.NodeFactsRequest) -> protocol.NodeFactsResponse:
    from gpuclaim.node.runner import node_facts

    port = request.get("port")
    return node_facts(int(port) if port is not None else None)


def _hardware(request: protocol.HardwareRequest) -> protocol.HardwareResponse:
    from gpuclaim.node.hardware import probe_hardware

    return probe_hardware()


def _sync_target(request: protocol.SyncTargetRequest) -> protocol.SyncTargetResponse:
    from gpuclaim.node.copies import sync_target

    files = request["files"]
    return sync_target(
        str(request["key"]),
        str(request["job_id"]),
        [str(f) for f in files] if files is not None else None,
        bool(request["reuse"]),
    )


def _sync_ready(request: protocol.SyncReadyRequest) -> protocol.SyncReadyResponse:
    from gpuclaim.node.copies import start_spare_builder

    return start_spare_builder(str(request["key"]), str(request["job_id"]))


def _pull_source(request: protocol.PullSourceRequest) -> protocol.PullSourceResponse:
    from gpuclaim.node.copies import pull_source

    return pull_source(str(request["directory"]), list(request["paths"]))


def _prune_copies(request: protocol.PruneCopiesRequest) -> protocol.PruneCopiesResponse:
    from gpuclaim.node.copies import prune_copies

    return prune_copies(list(request["remove"]), list(request["known"]))


def _ping(request: protocol.PingRequest) -> protocol.PingResponse:
    return {"version": __version__, "time": time.time()}


def _ray_check(request: protocol.RayCheckRequest) -> protocol.RayCheckResponse:
    from gpuclaim.node.ray_check import ray_check

    return ray_check(request["workenv"], request["workdir"])


# One handler per op of ``core/protocol.py``'s ``OpName``, each taking its op's request and
# answering its response (tests/unit/test_protocol.py holds the names and types to it).
_OPS: dict[str, Callable[[Any], object]] = {
    "probe": _probe,
    "doctor": _doctor,
    "store": _store,
    "launch": _launch,
    "keep_queue": _keep_queue,
    "stop_session": _stop_session,
    "read_log": _read_log,
    "node_facts": _node_facts,
    "hardware": _hardware,
    "sync_target": _sync_target,
    "sync_ready": _sync_ready,
    "pull_source": _pull_source,
    "prune_copies": _prune_copies,
    "ping": _ping,
    "ray_check": _ray_check,
}
