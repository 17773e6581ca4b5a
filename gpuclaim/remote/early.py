"""A first call's SSH sessions, started before the CLI has finished starting.

A look at nodes with no warm agent yet (the first call of the day) opens one SSH session
per node: the key exchange, and on the node a Python start waiting for the request. Both
wait on nothing the CLI computes, so ``start_first_contacts`` starts them as soon as the
config is read, while Python is still importing the command; the fan-out then adopts each
session (``OpenSshPool.converse``) and sends the request. On a real network that hides the
CLI's start-up behind the handshake's round trips; on one machine, it fills the core the
CLI's start leaves idle.

Only nodes whose warm path is not up get one (a warm socket answers in a round trip), and
a session nothing adopted (the command failed first) is closed at exit: its master stays,
for the next call.
"""

from __future__ import annotations

import atexit
import logging
import subprocess
from collections.abc import Iterable

from gpuclaim.core.config import Config
from gpuclaim.remote import install
from gpuclaim.remote.openssh import OpenSshPool, register_early, take_all_early
from gpuclaim.remote.session import ssh_client_of
from gpuclaim.remote.ssh import config_for_ssh_binary

log = logging.getLogger(__name__)


def start_first_contacts(config: Config, names: Iterable[str]) -> int:
    """Start the first-contact session to each of ``names`` (remote, no warm path yet) that
    a warm-agent call would start; how many were started."""
    if ssh_client_of(config) != "openssh" or config.agent_command is not None:
        return 0
    if not config.limits.warm_agent:
        return 0
    from gpuclaim.remote.bundle import agent_version, bytecode_tag
    from gpuclaim.remote.warm import WarmAgents, first_contact_arguments

    pool = OpenSshPool(
        config_for_ssh_binary(config.ssh_config_path), config.limits.connect_timeout_s
    )
    version = agent_version()
    warm = WarmAgents(pool, version, config.limits.agent_idle_s, _never)
    arguments = first_contact_arguments(version, config.limits.agent_idle_s)
    command = install.install_command(version, bytecode_tag(), arguments)
    started, hosts = 0, set()
    for name in dict.fromkeys(names):
        node = next((n for n in config.nodes if n.name == name), None)
        if node is None or node.transport != "ssh" or node.host in hosts:
            continue
        hosts.add(node.host)
        if not warm.wants_first_contact(node.host):
            continue
        register_early(
            node.host,
            command,
            subprocess.Popen(
                [*pool.base, "--", node.host, command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
            ),
        )
        log.debug("%s: first contact started before the command", node.host)
        started += 1
    if started:
        atexit.register(_close_unadopted)
    return started


def _never(*_args: object) -> dict[str, object]:
    raise AssertionError("only paths are asked of this WarmAgents")


def _close_unadopted() -> None:
    for proc in take_all_early():
        log.debug("an early first contact was not needed: closed")
        proc.kill()
        proc.wait()
