"""MIG slices as GPUs of their own, from what ``nvidia-smi`` prints.

A GPU in MIG mode cannot be handed out whole: what a job can use is one of its slices, named
to CUDA only by its ``MIG-`` UUID. ``-q -x`` says each slice's number, GPU/compute instance
and memory, and which processes run in which instance, but (drivers up to 535 at least) not
its UUID or profile; ``-L`` says both. So a node in MIG mode is read with both, and each
slice becomes a :class:`Gpu` in place of its parent. A slice whose UUID is unknown (``-L``
not run or failed) is left out: nobody could be pinned to it.

Node-side code: standard library only, Python 3.9. Pure functions: callers run the tool.
"""

from __future__ import annotations

import re

from gpuclaim.core.inventory import Gpu, GpuProcess
from gpuclaim.node.probe.smi_parse import _LIST_GPU, _LIST_MIG, _mib, _na

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

_PROFILE = re.compile(r"(?:\d+c\.)?\d+g\.\d+gb(?:\+\w+)?")


def profile_in(name: str) -> str:
    """The MIG profile in an NVML slice name ("NVIDIA H100 80GB HBM3 MIG 3g.40gb"), else
    the name's last word."""
    found = _PROFILE.findall(name)
    return found[-1] if found else (name.split() or ["slice"])[-1]


def needs_listing(gpus: list[Gpu]) -> bool:
    """True when some GPU is in MIG mode: its slices' UUIDs come from ``nvidia-smi -L``."""
    return any(g.mig_parent for g in gpus)


def parse_listed_slices(text: str) -> dict[str, dict[int, tuple[str, str]]]:
    """``nvidia-smi -L`` -> {parent UUID: {slice number: (profile, MIG UUID)}}."""
    out: dict[str, dict[int, tuple[str, str]]] = {}
    parent: Optional[str] = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _LIST_GPU.match(line)
        if m:
            parent = m["uuid"].strip()
            out[parent] = {}
            continue
        m = _LIST_MIG.match(line)
        if m and parent is not None:
            out[parent][int(m["index"])] = (m["profile"], m["uuid"].strip())
    return out


def slices_from_xml(
    gpus: list[Gpu], xml_text: str, listed: dict[str, dict[int, tuple[str, str]]]
) -> list[Gpu]:
    """``gpus`` (as :func:`parse_query_xml` read them from ``xml_text``) with each GPU in
    MIG mode replaced by its slices: memory from its ``mig_device``, processes by their GPU
    instance, UUID and profile from ``listed``. ValueError for numbers that do not parse."""
    import xml.etree.ElementTree as ET  # here: only a MIG GPU's look reads XML

    root = ET.fromstring(xml_text)
    out: list[Gpu] = []
    for gpu, el in zip(gpus, root.findall("gpu")):
        if not gpu.mig_parent:
            out.append(gpu)
            continue
        names = listed.get(gpu.uuid, {})
        in_instance: dict[Optional[str], list[int]] = {}
        for p in el.findall("processes/process_info"):
            gi = _na(p.findtext("gpu_instance_id"))
            pid = _na(p.findtext("pid"))
            if pid is not None and pid.isdigit():
                in_instance.setdefault(gi, []).append(int(pid))
        for dev in el.findall("mig_devices/mig_device"):
            found = _na(dev.findtext("index"))
            number = int(found) if found is not None and found.isdigit() else None
            if number is None or number not in names:
                continue
            profile, uuid = names[number]
            pids = set(in_instance.get(_na(dev.findtext("gpu_instance_id")), ()))
            out.append(
                as_slice(
                    gpu,
                    number,
                    profile,
                    uuid,
                    _mib(_na(dev.findtext("fb_memory_usage/total")), "total"),
                    _mib(_na(dev.findtext("fb_memory_usage/used")), "used"),
                    tuple(p.replace(gpu_uuid=uuid) for p in gpu.processes if p.pid in pids),
                )
            )
    return out


def as_slice(
    parent: Gpu,
    number: int,
    profile: str,
    uuid: str,
    total_mib: Optional[int],
    used_mib: Optional[int],
    processes: tuple[GpuProcess, ...],
) -> Gpu:
    """Slice ``number`` of ``parent`` as a GPU of its own."""
    return Gpu(
        node=parent.node,
        index=parent.index,
        uuid=uuid,
        name=parent.name,
        memory_total_mib=total_mib,
        memory_used_mib=used_mib,
        utilization_pct=None,  # not measured per slice (nor per GPU) under MIG
        pci_bus_id=parent.pci_bus_id,
        mig_mode=True,
        processes=processes,
        mig=number,
        mig_profile=profile,
        parent_uuid=parent.uuid,
    )
