"""Building the SSH side from the config: one pool and one agent client per process."""

from __future__ import annotations

from gpuclaim.core.config import Config
from gpuclaim.core.paths import which
from gpuclaim.remote.agent_client import AgentClient
from gpuclaim.remote.ssh import SshPool, config_for_ssh_binary


def ssh_client_of(config: Config) -> str:
    """The client a config means: "auto" is the ssh binary where there is one (it honours
    every ssh config feature and keeps masters and warm agents), else fabric."""
    if config.ssh_client == "auto":
        return "openssh" if which("ssh") else "fabric"
    return config.ssh_client


def open_agent(config: Config) -> AgentClient:
    if ssh_client_of(config) == "openssh":
        from gpuclaim.remote.openssh import OpenSshPool

        # the ssh binary reads the config file the rest of gpuclaim reads
        openssh = OpenSshPool(
            config_for_ssh_binary(config.ssh_config_path), config.limits.connect_timeout_s
        )
        client = AgentClient(openssh, config.agent_command)
        if config.limits.warm_agent and config.agent_command is None:
            from gpuclaim.remote.bundle import agent_version
            from gpuclaim.remote.warm import WarmAgents

            client.warm = WarmAgents(
                openssh,
                agent_version(),
                config.limits.agent_idle_s,
                client.first_contact,
            )
        return client
    pool = SshPool(config.ssh_config_path, config.limits.connect_timeout_s)
    return AgentClient(pool, config.agent_command)
