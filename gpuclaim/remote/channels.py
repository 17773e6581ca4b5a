"""The ``Channels`` the CLI and the board use, and the terminal ``attach`` hands over: the one
place that asks "local or over SSH?".

A node on this machine is answered in this process; any other through the agent over SSH,
with one pool of connections per process (opened on first use)."""

from __future__ import annotations

import shlex
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from gpuclaim.core.config import Config, NodeConfig
from gpuclaim.core.paths import which
from gpuclaim.node.channel import LocalChannel
from gpuclaim.node.tmux import attach_argv
from gpuclaim.remote.agent_client import AgentClient
from gpuclaim.remote.ssh import config_for_ssh_binary

if TYPE_CHECKING:
    from gpuclaim.core.protocol import OpName
    from gpuclaim.remote.tree_copy import TreeCopies


class SshChannel:
    def __init__(self, agent: AgentClient, host: str) -> None:
        self.agent = agent
        self.host = host

    def call(self, op: OpName, args: Mapping[str, Any], timeout: float) -> Any:
        return self.agent.call(self.host, {"op": op, **args}, timeout)


class NodeChannels:
    def __init__(self, config: Config, agent: Optional[AgentClient] = None) -> None:
        self.config = config
        self._agent = agent
        self._opening = threading.Lock()

    @property
    def agent(self) -> AgentClient:
        # A fan-out's threads all ask at once: one opens, the others wait for it (each
        # opening its own used to cost ~70 ms of CPU per node, 0.7 s at 16 nodes).
        with self._opening:
            if self._agent is None:
                from gpuclaim.remote.session import open_agent

                self._agent = open_agent(self.config)
        return self._agent

    def to_node(self, node: NodeConfig) -> LocalChannel | SshChannel:
        if node.transport == "local":
            return LocalChannel()
        return SshChannel(self.agent, node.host)

    def to_host(self, host: str) -> SshChannel:
        return SshChannel(self.agent, host)

    # -- files to and from nodes (engine.sync.TreeCopier) ----------------------------------
    def rsyncs_to(self, node: NodeConfig) -> bool:
        return self._copies.rsyncs_to(node)

    def push_tree(
        self,
        node: NodeConfig,
        root: str,
        files: Sequence[str],
        target: dict[str, Any],
        left_out: Sequence[str] = (),
    ) -> str:
        return self._copies.push_tree(node, root, files, target, left_out)

    def pull_tree(
        self, node: NodeConfig, directory: str, paths: Sequence[str], into: str, rsync: bool
    ) -> str:
        return self._copies.pull_tree(node, directory, paths, into, rsync)

    @property
    def _copies(self) -> TreeCopies:
        from gpuclaim.remote.tree_copy import TreeCopies

        return TreeCopies(lambda: self.agent.pool)

    def path_to(self, node: NodeConfig) -> str:
        """How requests reach ``node`` now, in words (doctor)."""
        if node.transport == "local":
            return "in this process"
        warm = self.agent.warm
        if warm is None:
            from gpuclaim.remote.session import ssh_client_of

            openssh = ssh_client_of(self.config) == "openssh"
            client = "the ssh binary" if openssh else "paramiko"
            return f"one-shot agent per request ({client}; the warm agent needs openssh)"
        return warm.path_of(node.host)


def attach_command(config: Config, node_name: str, session: str) -> list[str]:
    """The argv that attaches a terminal to a job's tmux session (``ssh -t`` for a node over
    SSH, with the ssh config every other command reads)."""
    node = config.node(node_name)
    tmux = attach_argv(session)
    if node.transport == "local":
        return tmux
    argv = [which("ssh") or "ssh", "-t"]
    config_file = config_for_ssh_binary(config.ssh_config_path)
    if config_file is not None:
        argv += ["-F", str(config_file)]
    return [*argv, node.host, " ".join(shlex.quote(a) for a in tmux)]
