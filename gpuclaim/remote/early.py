"""A first call's SSH sessions, started before the CLI has finished starting.

A look at nodes with no warm agent yet (the first call of the day) opens one SSH session
per node: the key exchange, and on the node the look itself (``remote.shell_look``: sh and
nvidia-smi, no Python). Neither waits on anything the CLI computes (the look's request is
made from the config), so ``start_first_contacts`` starts them as soon as the config is
read, while Python is still importing the command; the fan-out then adopts each session
(``OpenSshPool.run``) and reads its answer. On a real network that hides the CLI's start-up
behind the handshake's round trips; on one machine, it fills the core the CLI's start
leaves idle.

Only nodes whose warm path is not up get one (a warm socket answers in a round trip), and
a session nothing adopted (the command failed first, or never looked) is closed at exit:
its master stays, for the next call.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterable

from gpuclaim.core.config import Config
from gpuclaim.core.lazylog import get_logger
from gpuclaim.remote import early_plan
from gpuclaim.remote.openssh import OpenSshPool, register_early, take_all_early
from gpuclaim.remote.session import ssh_client_of
from gpuclaim.remote.ssh import config_for_ssh_binary

log = get_logger(__name__)  # logging imported on first use


def start_first_contacts(config: Config, names: Iterable[str]) -> int:
    """Start the first-contact session to each of ``names`` (remote, no warm path yet) that
    a warm-agent call would start; how many were started."""
    if ssh_client_of(config) != "openssh" or config.agent_command is not None:
        return 0
    if not config.limits.warm_agent:
        return 0
    from gpuclaim.core.protocol import probe_request
    from gpuclaim.remote.bundle import agent_version
    from gpuclaim.remote.shell_look import look_command
    from gpuclaim.remote.warm import WarmAgents

    limits = config.limits
    pool = OpenSshPool(config_for_ssh_binary(config.ssh_config_path), limits.connect_timeout_s)
    version = agent_version()
    warm = WarmAgents(pool, version, limits.agent_idle_s, _never)
    started, hosts = 0, set()
    # before the first: a spawn failing halfway (out of file descriptors) leaves the ones
    # started to be closed at exit all the same
    atexit.register(_close_unadopted)
    planned: list[tuple[str, list[str], list[str], list[str]]] = []
    folders = [str(pool.control_dir)]
    for name in dict.fromkeys(names):
        node = next((n for n in config.nodes if n.name == name), None)
        if node is None or node.transport != "ssh" or node.host in hosts:
            continue
        hosts.add(node.host)
        # The look the command's fan-out will ask for (engine.cluster): the same command
        request = probe_request(
            node.name,
            node.nvidia_smi,
            dict(node.env),
            limits.probe_timeout_s,
            limits.gpu_read_max_age_s,
        )
        command = look_command(version, limits.agent_idle_s, request)
        argv = [*pool.base, "--", node.host, command]
        planned.append((node.name, argv, warm.first_contact_guards(node.host), folders))
        if not warm.wants_first_contact(node.host):
            continue
        # spawned already from the last call's plan (remote.early_plan), or now
        proc = early_plan.take(node.name, argv)
        if proc is not None:
            log.debug("%s: first contact spawned from the last call's plan", node.host)
        else:
            proc = early_plan.spawn(argv)
        register_early(node.host, command, proc)
        log.debug("%s: first contact started before the command", node.host)
        started += 1
    early_plan.discard_rest()  # predicted, but not the command needed now
    if config.path is not None:
        early_plan.save(str(config.path), planned)
    return started


def _never(*_args: object) -> dict[str, object]:
    raise AssertionError("only paths are asked of this WarmAgents")


def _close_unadopted() -> None:
    for proc in take_all_early():
        log.debug("an early first contact was not needed: closed")
        proc.kill()
        proc.wait()
