"""The GPUs as ``nvidia-smi`` reports them, for nodes where NVML does not load.

Node-side code: standard library only, Python 3.9.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

from gpuclaim.core.errors import ProbeError
from gpuclaim.core.inventory import NodeInventory
from gpuclaim.node.probe.mig import needs_listing, parse_listed_slices, slices_from_xml
from gpuclaim.node.probe.owners import process_user
from gpuclaim.node.probe.smi_parse import looks_like_no_driver, parse_query_xml


def probe_nvidia_smi(
    node: str,
    smi: Sequence[str],
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 10.0,
) -> NodeInventory:
    """One ``nvidia-smi -q -x`` (GPUs and their processes), with a timeout: nvidia-smi can
    hang, and each call pays the driver's start-up (seconds without persistence mode)."""
    text = _run_smi(smi, ["-q", "-x"], env, timeout)
    listing = None
    if "<current_mig>Enabled" in text:  # slices' UUIDs: only -L says them
        listing = _run_smi(smi, ["-L"], env, timeout)
    return inventory_from_xml(node, text, process_user, listing)


def inventory_from_xml(
    node: str,
    text: str,
    user_of: Callable[[int], Optional[str]],
    listing: Optional[str] = None,
) -> NodeInventory:
    """The inventory ``nvidia-smi -q -x`` printed, its processes' owners from ``user_of``
    (here, or on the laptop for a shell look: ``remote.shell_look``). A GPU in MIG mode is
    its slices, named by ``listing`` (``nvidia-smi -L``): ``probe.mig``."""
    try:
        gpus, driver = parse_query_xml(text, node)
        gpus = [
            g.replace(processes=tuple(p.replace(user=user_of(p.pid)) for p in g.processes))
            for g in gpus
        ]
        if needs_listing(gpus):  # a second read of the XML, on MIG nodes only
            gpus = slices_from_xml(gpus, text, parse_listed_slices(listing or ""))
    except ValueError as exc:
        raise ProbeError(f"unexpected nvidia-smi output: {exc}") from exc
    return NodeInventory(node=node, gpus=tuple(gpus), source="nvidia-smi", driver_version=driver)


def _run_smi(
    smi: Sequence[str], args: list[str], env: Optional[Mapping[str, str]], timeout: float
) -> str:
    proc = _start_smi(smi, args, env)
    try:
        return _finish_smi(proc, timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _start_smi(
    smi: Sequence[str], args: list[str], env: Optional[Mapping[str, str]]
) -> subprocess.Popen[str]:
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        return subprocess.Popen(
            [*smi, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=full_env,
        )
    except OSError as exc:
        raise ProbeError(f"cannot run {smi[0]}: {exc.strerror}") from exc


def _finish_smi(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc is not None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.communicate()
        raise ProbeError(f"nvidia-smi did not answer within {timeout:.0f}s") from exc
    check_smi_exit(proc.returncode, stdout, stderr)
    return stdout


def check_smi_exit(code: int, stdout: str, stderr: str) -> None:
    """ProbeError, in words, for an ``nvidia-smi`` that exited ``code`` (0: nothing)."""
    if code != 0:
        message = (stdout + stderr).strip().splitlines()
        first = message[0] if message else f"exit status {code}"
        if looks_like_no_driver(stdout + stderr):
            raise ProbeError(f"nvidia-smi cannot reach the NVIDIA driver: {first}")
        raise ProbeError(f"nvidia-smi failed: {first}")
