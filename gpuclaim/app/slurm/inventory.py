"""Gathering the hardware inventory: ask every configured node (through the agent, over
SSH, in parallel) for its GPUs, CPUs, topology, memory and hostname, and turn each answer
into a :class:`NodeSpec`, reached at the address the SSH config gives it. The only part of
the export that talks to the nodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from gpuclaim.app.slurm.spec import GpuSlot, NodeSpec
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.protocol import HARDWARE, HardwareRequest
from gpuclaim.core.states import GpuState
from gpuclaim.engine.channel import ask

if TYPE_CHECKING:
    from gpuclaim.core.config import Config, NodeConfig
    from gpuclaim.core.model import NodeInventory
    from gpuclaim.core.protocol import HardwareResponse
    from gpuclaim.engine.cluster import NodeProber


def node_spec(
    name: str, hardware: HardwareResponse, inventory: NodeInventory, address: Optional[str] = None
) -> NodeSpec:
    """Join a node's ``hardware`` answer (see gpuclaim.node.hardware) with its GPU probe."""
    from gpuclaim.node.hardware import normalize_bus_id

    minors = dict(hardware["gpu_minors"])
    slots = []
    for g in inventory.gpus:
        minor = minors.get(g.uuid)
        if minor is None and g.pci_bus_id:
            minor = minors.get(normalize_bus_id(g.pci_bus_id))
        minor = g.index if minor is None else minor
        if g.mig is None:
            slots.append(GpuSlot(g.index, g.name, minor, uuid=g.uuid))
            continue
        parent = minors.get(g.parent_uuid or "")  # a slice's device file is its GPU's
        slots.append(
            GpuSlot(
                g.index,
                g.name,
                minor if parent is None else parent,
                mig=True,
                uuid=g.uuid,
                mig_profile=g.mig_profile or "",
                memory_mib=g.memory_total_mib or 0,
            )
        )
    return NodeSpec(
        name=name,
        hostname=str(hardware["hostname"] or ""),
        cpus=int(hardware["cpus"]),
        sockets=hardware["sockets"],
        cores_per_socket=hardware["cores_per_socket"],
        threads_per_core=hardware["threads_per_core"],
        real_memory_mib=hardware["real_memory_mib"],
        gpus=tuple(slots),
        address=address,
    )


def ssh_address(config: Config, node: NodeConfig) -> Optional[str]:
    """The address gpuclaim reaches ``node`` at: the HostName its SSH config gives the alias
    (the alias itself without one); None for a node on this machine."""
    if node.transport == "local":
        return None
    host = node.host.rsplit("@", 1)[-1]
    from gpuclaim.remote.ssh import load_ssh_config

    try:
        found = load_ssh_config(config.ssh_config_path).lookup(host).get("hostname")
    except GpuclaimError:  # an unreadable ssh config: the node did not answer either
        return host
    return str(found or host)


def gather_inventory(config: Config, prober: NodeProber) -> tuple[list[NodeSpec], dict[str, str]]:
    """Ask every node for its GPUs and hardware (in parallel, through the agent over SSH);
    returns the nodes that answered and, for the others, why not."""
    from gpuclaim.core.fanout import fan_out

    inventories = prober.probe(config.nodes)
    by_name = {n.name: n for n in config.nodes}

    def hardware_of(name: str) -> HardwareResponse:
        return ask(prober.channels.to_node(by_name[name]), HARDWARE, HardwareRequest(), 20.0)

    answers = fan_out(list(by_name), hardware_of, config.limits.deadline_s)
    specs, skipped = [], {}
    for name in by_name:
        inv, hw = inventories[name], answers[name]
        if inv.error or not inv.reachable:
            skipped[name] = inv.error or GpuState.UNREACHABLE.value
        elif not hw.ok or hw.value is None:
            skipped[name] = hw.error or "no hardware answer"
        else:
            specs.append(node_spec(name, hw.value, inv, ssh_address(config, by_name[name])))
    return specs, skipped
