"""How the engine reaches a node: one interface, so no use case asks "local or over SSH?".

``gpuclaim.node.channel`` answers in this process (a node on this machine, or the node a job
wrapper runs on); ``gpuclaim.remote.channels`` answers through the agent over SSH. The engine
only ever holds a ``Channels``, handed to it by whoever wires the command (app, node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from gpuclaim.core.config import NodeConfig

if TYPE_CHECKING:  # types alone: every look at a node goes through here
    from gpuclaim.core.protocol import Op, OpName, Req, Resp


class NodeChannel(Protocol):
    def call(self, op: OpName, args: Mapping[str, Any], timeout: float) -> Any:
        """Run one agent op (``gpuclaim.node.agent``) there; its result as JSON gave it, or
        its error raised as ours (``gpuclaim.core.errors.error_from_wire``). Typed callers
        use ``ask``."""
        ...


class Channels(Protocol):
    def to_node(self, node: NodeConfig) -> NodeChannel:
        """The channel to a configured node."""
        ...

    def to_host(self, host: str) -> NodeChannel:
        """The channel to an SSH host that is not a node (``storage = "ssh://HOST/..."``)."""
        ...


def ask(channel: NodeChannel, op: Op[Req, Resp], request: Req, timeout: float) -> Resp:
    """``op`` with its typed request (``core/protocol.py``), its typed response: the one place
    an answer comes off the wire untyped, taken for what the protocol says it is."""
    return cast("Resp", channel.call(op.name, request, timeout))
