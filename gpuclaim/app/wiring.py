"""Wiring a command: the prober over this process's channels, the store the config names
(here, or on its SSH host through the agent). Both faces (the CLI, the board) get their
parts from here."""

from __future__ import annotations

from typing import cast

from gpuclaim.core.config import Config, parse_storage_url
from gpuclaim.core.paths import host_lock_dir
from gpuclaim.engine.cluster import NodeProber
from gpuclaim.remote.channels import NodeChannels
from gpuclaim.store import ClaimStore, Store


def make_prober(config: Config) -> NodeProber:
    """One per process: its channels hold the SSH connections every step reuses."""
    return NodeProber(config, NodeChannels(config))


def open_store(config: Config, prober: NodeProber) -> Store:
    """The store the config names, not yet ``ensure``d (the caller decides how strictly)."""
    if config.storage.startswith("ssh://"):
        from gpuclaim.remote.store_proxy import RemoteStore  # here: only an ssh:// storage

        host, root = parse_storage_url(config.storage)
        # RemoteStore's methods are made from the interface's names (one forwarding method
        # each: test_architecture checks it whole), which mypy cannot see
        return cast(Store, RemoteStore(prober.channels.to_host(host), root))
    return ClaimStore(config.storage_path, host_lock_dir())
