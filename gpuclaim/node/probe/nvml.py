"""Probe this machine's GPUs through NVML (the ``nvidia-ml-py`` distribution, module ``pynvml``).

``pynvml`` is imported inside :func:`probe_nvml` so that importing this module never
needs it.  Any failure to load the library or to initialise NVML (no driver, no GPU)
is a :class:`~gpuclaim.core.errors.ProbeError`; per-device queries a part does not support
(memory on GB10, utilization under MIG, MIG mode on pre-Ampere) give ``None``.
"""

from __future__ import annotations

import functools
import sys

from gpuclaim.core.errors import ProbeError
from gpuclaim.core.inventory import Gpu, GpuProcess, NodeInventory
from gpuclaim.node.probe.owners import process_user

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any, Callable, Optional, TypeVar

    T = TypeVar("T")

MIB = 1024 * 1024
NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long


_keep = {"on": False, "ready": False}  # a warm agent keeps NVML initialised between probes


def keep_initialised() -> None:
    """From now on NVML stays initialised after a probe (its init is the slow part)."""
    _keep["on"] = True


VENDORED = "vendor"  # the bundle's directory that carries nvidia-ml-py to nodes without it


def bindings() -> Any:
    """``pynvml``: the node's own if it has one, else the copy the agent bundle carries,
    but only where the driver's library loads (so a node without a GPU pays no import)."""
    try:
        import pynvml

        return pynvml
    except ImportError as exc:
        missing = exc
    from importlib.machinery import PathFinder

    from gpuclaim.node.home import bundle_root

    root = bundle_root()
    vendored = f"{root}/{VENDORED}" if root else ""  # a zip's subdir is a path entry too
    # found, not imported: the bundle's zip or dir alike
    if not vendored or PathFinder.find_spec("pynvml", [vendored]) is None:
        raise ProbeError(f"NVML bindings not installed: {missing}")
    import ctypes  # here: the CLI imports this module for VENDORED alone

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        raise ProbeError(f"NVML library not found: {exc}") from None
    if vendored not in sys.path:
        sys.path.append(vendored)  # last: never shadows anything of the node's
    import pynvml

    return pynvml


def probe_nvml(node: str) -> NodeInventory:
    """All GPUs of this machine, with their compute and graphics processes."""
    pynvml = bindings()
    if not _keep["ready"]:
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _NoPermission...
            raise ProbeError(f"NVML cannot start: {_message(exc)}") from exc
        _keep["ready"] = _keep["on"]
    try:
        driver = _optional(pynvml, lambda: _text(pynvml.nvmlSystemGetDriverVersion()))
        try:
            count = pynvml.nvmlDeviceGetCount()
            gpus = tuple(g for i in range(count) for g in _units(_device(pynvml, node, i)))
        except pynvml.NVMLError as exc:
            raise ProbeError(f"NVML query failed: {_message(exc)}") from exc
        return NodeInventory(node=node, gpus=gpus, source="nvml", driver_version=driver)
    finally:
        if not _keep["ready"]:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass


def _units(found: tuple[Gpu, list[Gpu]]) -> list[Gpu]:
    """A GPU, or in MIG mode its slices (``probe.mig``): it is never handed out whole."""
    gpu, slices = found
    return slices if gpu.mig_parent else [gpu]


def _device(nv: Any, node: str, index: int) -> tuple[Gpu, list[Gpu]]:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    uuid = _text(nv.nvmlDeviceGetUUID(handle))
    memory = _memory(nv, handle)
    util = _optional(nv, lambda: nv.nvmlDeviceGetUtilizationRates(handle))
    mig = _optional(nv, lambda: nv.nvmlDeviceGetMigMode(handle))
    mig_mode = None if mig is None else mig[0] == nv.NVML_DEVICE_MIG_ENABLE
    pci = _optional(nv, lambda: nv.nvmlDeviceGetPciInfo(handle))
    children = _mig_children(nv, handle) if mig_mode else []
    gpu = Gpu(
        node=node,
        index=index,
        uuid=uuid,
        name=_text(nv.nvmlDeviceGetName(handle)),
        memory_total_mib=None if memory is None else int(memory.total) // MIB,
        memory_used_mib=None if memory is None else int(memory.used) // MIB,
        utilization_pct=None if util is None else int(util.gpu),
        pci_bus_id=None if pci is None else _text(pci.busId),
        mig_mode=mig_mode,
        mig_devices=tuple(child_uuid for _, child_uuid in children),
        processes=_processes(nv, [handle, *(h for h, _ in children)], uuid),
    )
    return gpu, [_slice(nv, gpu, number, h, u) for number, (h, u) in enumerate(children)]


def _slice(nv: Any, parent: Gpu, number: int, handle: Any, uuid: str) -> Gpu:
    """Slice ``number`` of ``parent``: its memory, its processes, its profile from its name
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb")."""
    from gpuclaim.node.probe.mig import as_slice, profile_in

    memory = _memory(nv, handle)
    name = _optional(nv, lambda: _text(nv.nvmlDeviceGetName(handle))) or ""
    return as_slice(
        parent,
        number,
        profile_in(name),
        uuid,
        None if memory is None else int(memory.total) // MIB,
        None if memory is None else int(memory.used) // MIB,
        tuple(p.replace(gpu_uuid=uuid) for p in _processes(nv, [handle], uuid)),
    )


def _memory(nv: Any, handle: Any) -> Any:
    """Memory info v2 where the library has it: its ``used`` leaves out the driver's
    reserved memory, as nvidia-smi does; v1 counts it, so an idle GPU looks used."""
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None:
        try:
            return nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except (nv.NVMLError, TypeError):
            pass
    return _optional(nv, lambda: nv.nvmlDeviceGetMemoryInfo(handle))


def _processes(nv: Any, handles: list[Any], uuid: str) -> tuple[GpuProcess, ...]:
    """Compute and graphics processes, merged per pid into kinds C, G or C+G.

    ``handles`` is the GPU and its MIG instances: without privileges NVML lists MIG
    processes only on the instance handles.  All are reported with the GPU's UUID,
    as nvidia-smi does.
    """
    kinds: dict[int, str] = {}
    memory: dict[int, Optional[int]] = {}
    queries = (
        ("C", nv.nvmlDeviceGetComputeRunningProcesses),
        ("G", nv.nvmlDeviceGetGraphicsRunningProcesses),
    )
    for handle, (kind, query) in ((h, q) for h in handles for q in queries):
        for info in _optional(nv, functools.partial(query, handle)) or ():
            pid = int(info.pid)
            kinds[pid] = "C+G" if kinds.get(pid, kind) != kind else kind
            used = _used_mib(getattr(info, "usedGpuMemory", None))
            if used is not None or pid not in memory:
                memory[pid] = used
    return tuple(
        GpuProcess(
            pid=pid,
            name=_process_name(nv, pid),
            used_memory_mib=memory[pid],
            user=process_user(pid),
            gpu_uuid=uuid,
            kind=kind,
        )
        for pid, kind in kinds.items()
    )


def _used_mib(used: Optional[int]) -> Optional[int]:
    """Bytes -> MiB; None (WDDM) and NVML's all-ones "not available" value stay None."""
    if used is None or int(used) == NOT_AVAILABLE:
        return None
    return int(used) // MIB


def _mig_children(nv: Any, handle: Any) -> list[tuple[Any, str]]:
    """(handle, MIG UUID) of each MIG instance; empty slots raise NotFound and are skipped."""
    slots = _optional(nv, lambda: nv.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
    children = []
    for slot in range(slots):
        child = _optional(
            nv, functools.partial(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        )
        if child is not None:
            uuid = _optional(nv, functools.partial(_uuid_of, nv, child))
            if uuid:
                children.append((child, uuid))
    return children


def _process_name(nv: Any, pid: int) -> str:
    """/proc/<pid>/comm, then the first word of cmdline, then NVML's own answer."""
    for name in ("comm", "cmdline"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        text = raw.split(b"\0")[0].decode("utf-8", "replace").strip()
        if text:
            return text
    return _optional(nv, lambda: _text(nv.nvmlSystemGetProcessName(pid))) or ""


def _optional(nv: Any, call: Callable[[], T]) -> Optional[T]:
    """``call()``, or None when NVML says the query is unsupported or has no answer."""
    try:
        return call()
    except nv.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _message(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:
        return type(exc).__name__


def _uuid_of(nv: Any, handle: Any) -> str:
    return _text(nv.nvmlDeviceGetUUID(handle))
