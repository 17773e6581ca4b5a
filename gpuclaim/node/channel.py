"""The agent answered in this process: the ``Channels`` of a node on this machine, and of a job
wrapper or queue keeper, which only ever act on their own node."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuclaim.core.config import Config, NodeConfig
from gpuclaim.core.errors import UnreachableError, error_from_wire
from gpuclaim.engine.cluster import NodeProber
from gpuclaim.node.agent import handle

if TYPE_CHECKING:
    from gpuclaim.core.protocol import OpName


class LocalChannel:
    def call(self, op: OpName, args: Mapping[str, Any], timeout: float) -> Any:
        answer = handle({"op": op, **args})
        if "error" in answer:
            raise error_from_wire(answer["error"])
        return answer["result"]


class LocalChannels:
    """Every node is reached in this process: for nodes whose transport is local, and for code
    on a node that was handed a config seen from that node (``transport = "local"``)."""

    def to_node(self, node: NodeConfig) -> LocalChannel:
        if node.transport != "local":
            raise UnreachableError(f"{node.name}: not reachable from here without SSH")
        return LocalChannel()

    def to_host(self, host: str) -> LocalChannel:
        raise UnreachableError(f"{host}: not reachable from here without SSH")


def local_prober(config: Config, node: str) -> NodeProber:
    """How code on ``node`` itself (a wrapper, a keeper) sees the cluster: that node alone,
    reached in this process."""
    return NodeProber(config.seen_from(node), LocalChannels())
