"""Building the SSH side from the config: one pool and one agent client per process."""

from __future__ import annotations

from gpuclaim.core.config import Config
from gpuclaim.remote.agent_client import AgentClient
from gpuclaim.remote.ssh import SshPool, config_for_ssh_binary


def open_agent(config: Config) -> AgentClient:
    if config.ssh_client == "openssh":
        from gpuclaim.remote.openssh import OpenSshPool

        return AgentClient(
            # the ssh binary reads the config file the rest of gpuclaim reads
            OpenSshPool(
                config_for_ssh_binary(config.ssh_config_path), config.limits.connect_timeout_s
            ),
            config.agent_command,
        )
    pool = SshPool(config.ssh_config_path, config.limits.connect_timeout_s)
    return AgentClient(pool, config.agent_command)
