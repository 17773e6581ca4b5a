"""A module's logger that imports ``logging`` only when something is logged: a first call
spawns its SSH sessions before the ~4 ms that importing ``logging`` costs (``remote.early``)."""

from __future__ import annotations

from typing import Any


class LazyLogger:
    """``logging.getLogger(name)``, looked up on first use."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            import logging

            self._logger = logging.getLogger(self._name)
        return getattr(self._logger, attr)


def get_logger(name: str) -> Any:
    return LazyLogger(name)
