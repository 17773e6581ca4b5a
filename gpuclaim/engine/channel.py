"""How the engine reaches a node: one interface, so no use case asks "local or over SSH?".

``gpuclaim.node.channel`` answers in this process (a node on this machine, or the node a job
wrapper runs on); ``gpuclaim.remote.channels`` answers through the agent over SSH. The engine
only ever holds a ``Channels``, handed to it by whoever wires the command (app, node).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpuclaim.core.config import NodeConfig


class NodeChannel(Protocol):
    def call(self, op: str, args: Mapping[str, Any], timeout: float) -> Any:
        """Run one agent op (``gpuclaim.node.agent``) there; its result, or its error raised
        as ours (``gpuclaim.core.errors.error_from_wire``)."""
        ...


class Channels(Protocol):
    def to_node(self, node: NodeConfig) -> NodeChannel:
        """The channel to a configured node."""
        ...

    def to_host(self, host: str) -> NodeChannel:
        """The channel to an SSH host that is not a node (``storage = "ssh://HOST/..."``)."""
        ...
