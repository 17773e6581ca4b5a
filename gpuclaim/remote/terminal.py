"""A terminal on a job's tmux session: the argv ``attach`` and the board hand the terminal to
(``ssh -t`` for a node over SSH, with the ssh config every other command reads)."""

from __future__ import annotations

import shlex
import shutil

from gpuclaim.core.config import Config
from gpuclaim.node.tmux import attach_argv
from gpuclaim.remote.ssh import config_for_ssh_binary


def attach_command(config: Config, node_name: str, session: str) -> list[str]:
    node = config.node(node_name)
    tmux = attach_argv(session)
    if node.transport == "local":
        return tmux
    argv = [shutil.which("ssh") or "ssh", "-t"]
    config_file = config_for_ssh_binary(config.ssh_config_path)
    if config_file is not None:
        argv += ["-F", str(config_file)]
    return [*argv, node.host, " ".join(shlex.quote(a) for a in tmux)]
