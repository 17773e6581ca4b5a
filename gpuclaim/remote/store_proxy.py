"""``storage = "ssh://HOST/PATH"``: the claim store run on its own host through the agent.

Every method is one agent call, executed there by the same ``ClaimStore`` code, so a laptop
that does not mount the storage gets the same atomic claims, and the storage host's clock.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from gpuclaim.errors import ConfigError, StorageRefusesWrites
from gpuclaim.model import Claim, Event
from gpuclaim.remote.agent_client import AgentClient
from gpuclaim.store import PLAIN_METHODS, ClaimFile, Snapshot


def parse_storage_url(url: str) -> tuple[str, str]:
    """``ssh://node01/srv/gpuclaim`` -> ("node01", "/srv/gpuclaim")."""
    parts = urlsplit(url)
    if parts.scheme != "ssh" or not parts.hostname or not parts.path.startswith("/"):
        raise ConfigError(f"'storage' {url!r}: write ssh://HOST/ABSOLUTE/PATH")
    host = parts.hostname if parts.username is None else f"{parts.username}@{parts.hostname}"
    if parts.port:
        raise ConfigError(f"'storage' {url!r}: put the port in your ssh config, not the URL")
    return host, parts.path


class RemoteStore:
    """The ``ClaimStore`` interface, answered by the agent on the storage host."""

    def __init__(self, agent: AgentClient, host: str, root: str, timeout: float = 20.0) -> None:
        self.agent = agent
        self.host_alias = host
        self.root = Path(root)
        self.timeout = timeout
        self._offset: Optional[float] = None
        self.refusal: Optional[StorageRefusesWrites] = None

    def _call(self, method: str, **args: Any) -> Any:
        request = {"op": "store", "root": str(self.root), "method": method, "args": args}
        return self.agent.call(self.host_alias, request, self.timeout)

    def __getattr__(self, name: str) -> Any:
        # Job and queue methods take and return plain JSON: forwarded by name.
        if name in PLAIN_METHODS:
            return lambda **kwargs: self._call(name, **kwargs)
        raise AttributeError(name)

    def ensure(self, create: bool = False) -> None:
        self._call("ensure", create=create)

    def now(self) -> float:
        """The storage host's clock, measured once per process (one round trip)."""
        if self._offset is None:
            before = time.time()
            clock = self._call("clock")
            self._offset = float(clock["now"]) - (before + time.time()) / 2
            if clock.get("refusal"):
                self.refusal = StorageRefusesWrites(str(clock["refusal"]))
        return time.time() + self._offset

    def snapshot(self) -> Snapshot:
        return Snapshot.from_dict(self._call("snapshot"))

    def acquire(self, claim: Claim) -> None:
        self._call("acquire", claim=claim.to_dict())

    def remove_gpu(self, gpu_uuid: str, claim_id: Optional[str], *, inode: int = 0) -> bool:
        return bool(self._call("remove_gpu", uuid=gpu_uuid, claim_id=claim_id, inode=inode))

    def quarantine_corrupt(self, cf: ClaimFile) -> bool:
        return bool(self._call("quarantine_corrupt", file=cf.to_dict()))

    def rewrite(self, old: Claim, new: Claim) -> None:
        self._call("rewrite", old=old.to_dict(), new=new.to_dict())

    def append_event(self, event: Event) -> None:
        self._call("append_event", event=event.to_dict())

    def read_events(self) -> tuple[list[Event], int]:
        data = self._call("read_events")
        return [Event.from_dict(e) for e in data["events"]], int(data["bad"])

    def drains(self) -> dict[str, dict[str, Any]]:
        return dict(self._call("drains"))

    def set_drain(self, node: str, info: dict[str, Any]) -> None:
        self._call("set_drain", node=node, info=info)

    def clear_drain(self, node: str) -> bool:
        return bool(self._call("clear_drain", node=node))

    def sweep(self, max_age_s: float = 3600.0) -> int:
        return int(self._call("sweep"))
