"""Drained nodes: no new claims there."""

from __future__ import annotations

import json
import os

from gpuclaim.core.records import Drain
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import _encode


class DrainsPart(StoreBase):
    def drains(self) -> dict[str, Drain]:
        result: dict[str, Drain] = {}
        try:
            names = os.listdir(self._p("drain"))
        except FileNotFoundError:
            return result
        for name in names:
            if name.startswith("."):
                continue
            try:
                result[name] = json.loads(self._p("drain", name).read_text("utf-8"))
            except (OSError, ValueError):
                result[name] = {"user": "?", "reason": "(unreadable drain mark)"}
        return result

    def set_drain(self, node: str, info: Drain) -> None:
        self._publish(self._stage(_encode(info)), self._p("drain", node))

    def clear_drain(self, node: str) -> bool:
        try:
            os.unlink(self._p("drain", node))
        except FileNotFoundError:
            return False
        return True
