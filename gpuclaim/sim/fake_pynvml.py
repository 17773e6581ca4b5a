"""The simulated GPUs' NVML face: a module a test node can import as ``pynvml``.

The same GPUs as :mod:`fake_nvidia_smi` (same state file, same live jobs, same UUIDs), seen
through the calls of ``nvidia-ml-py`` that gpuclaim makes, so that a test node can exercise
the in-process NVML path a real node with a driver takes. Copy this file as ``pynvml.py``
next to ``fake_nvidia_smi.py`` and put that directory on the node's ``PYTHONPATH``.

Like the real library, initialisation is the slow part: a node's ``delay_ms`` is spent in
:func:`nvmlInit`, and ``"fail": true`` makes it raise ``NVMLError_DriverNotLoaded``. Each
:func:`nvmlDeviceGetCount` reads the state again (a probe starts with it), so a process
that keeps NVML initialised still sees jobs come and go.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Optional

try:  # inside the package (tests) or copied alone beside it (a test node)
    from gpuclaim.sim import fake_nvidia_smi as smi
except ImportError:  # pragma: no cover - the copied layout
    import fake_nvidia_smi as smi  # type: ignore[import-not-found,no-redef]

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlMemory_v2 = 0x02000028

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
}
MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


class NVMLError_DriverNotLoaded(NVMLError):  # the real library's name
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_DRIVER_NOT_LOADED)


class _Struct:
    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


_state: dict[str, Any] = {"init": 0, "driver": smi.DEFAULT_DRIVER, "gpus": []}


def _node() -> str:
    return os.environ.get("GPUCLAIM_NODE") or socket.gethostname().split(".")[0]


def _load() -> tuple[str, dict[str, Any]]:
    try:
        driver, entry = smi.load_node(_node())
    except smi.Exit:
        raise NVMLError_DriverNotLoaded() from None
    if entry.get("fail"):
        raise NVMLError_DriverNotLoaded()
    return driver, entry


def _initialised() -> None:
    if not _state["init"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def nvmlInit() -> None:
    driver, entry = _load()
    delay = int(entry.get("delay_ms") or 0)
    if delay:
        time.sleep(delay / 1000)
    _state.update(init=_state["init"] + 1, driver=driver)


def nvmlShutdown() -> None:
    _initialised()
    _state["init"] -= 1


def nvmlSystemGetDriverVersion() -> str:
    _initialised()
    return str(_state["driver"])


def nvmlDeviceGetCount() -> int:
    _initialised()
    driver, entry = _load()
    _state.update(driver=driver, gpus=smi.build_gpus(_node(), entry))
    return len(_state["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> smi.SimGpu:
    _initialised()
    if not _state["gpus"]:
        nvmlDeviceGetCount()  # a caller that did not count first
    gpus = _state["gpus"]
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return gpus[index]  # type: ignore[no-any-return]


def nvmlDeviceGetUUID(handle: smi.SimGpu) -> str:
    return handle.uuid


def nvmlDeviceGetName(handle: smi.SimGpu) -> str:
    return handle.name


def nvmlDeviceGetMemoryInfo(handle: smi.SimGpu, version: Optional[int] = None) -> _Struct:
    if handle.total is None:  # unified memory (GB10): the real call is not supported
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    used = handle.used or 0
    return _Struct(total=handle.total * MIB, used=used * MIB, free=(handle.total - used) * MIB)


def nvmlDeviceGetUtilizationRates(handle: smi.SimGpu) -> _Struct:
    util = handle.utilization
    if util is None:  # MIG mode
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _Struct(gpu=util, memory=util // 2)


def nvmlDeviceGetMigMode(handle: smi.SimGpu) -> list[int]:
    mode = NVML_DEVICE_MIG_ENABLE if handle.mig else NVML_DEVICE_MIG_DISABLE
    return [mode, mode]


def nvmlDeviceGetPersistenceMode(handle: smi.SimGpu) -> int:
    return 1 if handle.persistence else 0


def nvmlDeviceGetPciInfo(handle: smi.SimGpu) -> _Struct:
    return _Struct(busId=handle.bus_id)


def _processes(handle: smi.SimGpu, kinds: tuple[str, ...]) -> list[_Struct]:
    return [
        _Struct(pid=p.pid, usedGpuMemory=None if p.used_mib is None else p.used_mib * MIB)
        for p in handle.processes
        if p.kind in kinds
    ]


def nvmlDeviceGetComputeRunningProcesses(handle: smi.SimGpu) -> list[_Struct]:
    return _processes(handle, ("C", "C+G"))


def nvmlDeviceGetGraphicsRunningProcesses(handle: smi.SimGpu) -> list[_Struct]:
    return _processes(handle, ("G", "C+G"))


def nvmlDeviceGetMaxMigDeviceCount(handle: smi.SimGpu) -> int:
    return 7 if handle.mig else 0  # an H100's most slices; unused ones are Not Found


def nvmlDeviceGetMigDeviceHandleByIndex(handle: smi.SimGpu, index: int) -> Any:
    if 0 <= index < len(handle.slices):
        return handle.slices[index]
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlSystemGetProcessName(pid: int) -> str:
    for gpu in _state["gpus"]:
        for proc in gpu.processes:
            if proc.pid == pid:
                return str(proc.name)
    raise NVMLError(NVML_ERROR_NOT_FOUND)
