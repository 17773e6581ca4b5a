"""``storage = "ssh://HOST/PATH"``: the claim store run on its own host through the agent.

Every method of ``gpuclaim.store.Store`` is one agent call, executed there by the same
``ClaimStore`` code, so a laptop that does not mount the storage gets the same atomic claims,
and the storage host's clock. The methods are made from the interface, not listed here.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from gpuclaim.core.errors import StorageRefusesWrites
from gpuclaim.engine.channel import NodeChannel
from gpuclaim.store import STORE_CODEC, STORE_METHODS

if TYPE_CHECKING:
    from gpuclaim.core.protocol import StoreRequest


class RemoteStore:
    """The ``Store`` interface, answered by the agent on the storage host."""

    def __init__(self, channel: NodeChannel, root: str, timeout: float = 20.0) -> None:
        self.channel = channel
        self.root = Path(root)
        self.timeout = timeout
        self._offset: Optional[float] = None
        self.refusal: Optional[StorageRefusesWrites] = None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        request: StoreRequest = {
            "root": str(self.root),
            "method": method,
            "args": STORE_CODEC.encode(list(args)),
            "kwargs": STORE_CODEC.encode(kwargs),
        }
        return STORE_CODEC.decode(self.channel.call("store", request, self.timeout))

    def now(self) -> float:
        """The storage host's clock, measured once per process (one round trip)."""
        if self._offset is None:
            before = time.time()
            clock = self.call("clock")
            self._offset = float(clock["now"]) - (before + time.time()) / 2
            if clock.get("refusal"):
                self.refusal = StorageRefusesWrites(str(clock["refusal"]))
        return time.time() + self._offset


def _forward(method: str) -> Callable[..., Any]:
    def forward(self: RemoteStore, *args: Any, **kwargs: Any) -> Any:
        return self.call(method, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = method
    return forward


for _method in sorted(STORE_METHODS - set(vars(RemoteStore))):
    setattr(RemoteStore, _method, _forward(_method))
