"""Building the SSH side from the config: one pool and one agent client per process."""

from __future__ import annotations

from gpuclaim.core.config import Config
from gpuclaim.remote.agent_client import AgentClient
from gpuclaim.remote.ssh import SshPool, config_for_ssh_binary


def open_agent(config: Config) -> AgentClient:
    if config.ssh_client == "openssh":
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
                client.run_agent_raw,
            )
        return client
    pool = SshPool(config.ssh_config_path, config.limits.connect_timeout_s)
    return AgentClient(pool, config.agent_command)
