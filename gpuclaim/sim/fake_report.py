"""The fake ``nvidia-smi``'s reports: ``-q -x`` and ``-L``, and the MIG slices of a simulated
GPU they print. Standard library only, like its caller: copy it beside
``fake_nvidia_smi.py`` (as a test node's ``bin/`` has it)."""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Any, Optional


def sim_mig_uuid(node: str, index: int, number: int) -> str:
    """The simulated MIG slice's UUID, shaped like a real one."""
    h = hashlib.md5(f"{node}-{index}-mig{number}".encode(), usedforsecurity=False).hexdigest()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class SimSlice:
    """One MIG slice of a simulated GPU."""

    def __init__(
        self, node: str, gpu: int, number: int, profile: str, total: int, name: str
    ) -> None:
        self.number = number
        self.name = name  # as NVML names a slice: "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
        self.profile = profile
        self.uuid = sim_mig_uuid(node, gpu, number)
        self.gpu_instance = 2 * number + 1
        self.total = total
        self.processes: list[Any] = []

    @property
    def used(self) -> int:
        return min(self.total, sum(p.used_mib or 0 for p in self.processes))


def profile_mib(profile: str) -> int:
    gb = profile.split(".")[-1].lower().split("gb")[0]
    return int(gb) * 1024 - 256 if gb.isdigit() else 10 * 1024


def mig_devices_xml(g: Any) -> list[str]:
    """``<mig_devices>`` as a v12 driver prints it: number, instance ids, memory; no UUID."""
    if not g.slices:
        return ["\t\t<mig_devices>\n\t\t\tNone\n\t\t</mig_devices>"]
    lines = ["\t\t<mig_devices>"]
    for m in g.slices:
        lines += [
            "\t\t\t<mig_device>",
            f"\t\t\t\t<index>{m.number}</index>",
            f"\t\t\t\t<gpu_instance_id>{m.gpu_instance}</gpu_instance_id>",
            "\t\t\t\t<compute_instance_id>0</compute_instance_id>",
            "\t\t\t\t<fb_memory_usage>",
            f"\t\t\t\t\t<total>{m.total} MiB</total>",
            "\t\t\t\t\t<reserved>0 MiB</reserved>",
            f"\t\t\t\t\t<used>{m.used} MiB</used>",
            f"\t\t\t\t\t<free>{m.total - m.used} MiB</free>",
            "\t\t\t\t</fb_memory_usage>",
            "\t\t\t</mig_device>",
        ]
    return [*lines, "\t\t</mig_devices>"]


def opt(value: Optional[int]) -> str:
    return "N/A" if value is None else str(value)


def listed(g: Any) -> list[str]:
    """``-L``: the GPU, and its MIG slices under it in the real tool's columns."""
    lines = [f"GPU {g.index}: {g.name} (UUID: {g.uuid})"]
    for m in g.slices:
        lines.append(f"  MIG {m.profile:<11} Device {m.number:>2}: (UUID: {m.uuid})")
    return lines


def query_xml(ctx: Any, gpus: list[Any]) -> list[str]:
    """``-q -x``: the elements of the real DTD (v12) that describe identity, memory,
    utilization, MIG mode and processes, in the real nesting and with the real units."""

    def mib(value: Optional[int]) -> str:
        return "N/A" if value is None else f"{value} MiB"

    when = dt.datetime.now().strftime("%a %b %d %H:%M:%S %Y")
    lines = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
        "<nvidia_smi_log>",
        f"\t<timestamp>{when}</timestamp>",
        f"\t<driver_version>{_xml(ctx.driver)}</driver_version>",
        f"\t<attached_gpus>{len(ctx.gpus)}</attached_gpus>",
    ]
    for g in gpus:
        mode = "Enabled" if g.mig else "Disabled"
        util = "N/A" if g.utilization is None else f"{g.utilization} %"
        lines += [
            f'\t<gpu id="{g.bus_id}">',
            f"\t\t<product_name>{_xml(g.name)}</product_name>",
            f"\t\t<mig_mode>\n\t\t\t<current_mig>{mode}</current_mig>",
            f"\t\t\t<pending_mig>{mode}</pending_mig>\n\t\t</mig_mode>",
            *mig_devices_xml(g),
            f"\t\t<uuid>{g.uuid}</uuid>",
            f"\t\t<minor_number>{g.index}</minor_number>",
            f"\t\t<pci>\n\t\t\t<pci_bus_id>{g.bus_id}</pci_bus_id>\n\t\t</pci>",
            "\t\t<fb_memory_usage>",
            f"\t\t\t<total>{mib(g.total)}</total>",
            f"\t\t\t<reserved>{mib(None if g.total is None else 0)}</reserved>",
            f"\t\t\t<used>{mib(g.used)}</used>",
            f"\t\t\t<free>{mib(g.free)}</free>",
            "\t\t</fb_memory_usage>",
            f"\t\t<utilization>\n\t\t\t<gpu_util>{util}</gpu_util>\n\t\t</utilization>",
            "\t\t<processes>",
        ]
        for p in g.processes:
            lines += [
                "\t\t\t<process_info>",
                f"\t\t\t\t<gpu_instance_id>{opt(p.gpu_instance)}</gpu_instance_id>",
                f"\t\t\t\t<compute_instance_id>{opt(p.gpu_instance and 0)}</compute_instance_id>",
                f"\t\t\t\t<pid>{p.pid}</pid>",
                f"\t\t\t\t<type>{_xml(p.kind)}</type>",
                f"\t\t\t\t<process_name>{_xml(p.name)}</process_name>",
                f"\t\t\t\t<used_memory>{mib(p.used_mib)}</used_memory>",
                "\t\t\t</process_info>",
            ]
        lines += ["\t\t</processes>", "\t</gpu>"]
    lines.append("</nvidia_smi_log>")
    return lines


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
