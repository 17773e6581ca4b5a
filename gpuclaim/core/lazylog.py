"""Logging that costs nothing until something is shown: importing ``logging`` (with the
``traceback``, ``textwrap`` and ``string`` it pulls in) is ~9 % of a first call's CPU, and
without ``--debug`` gpuclaim's own messages are never shown.

- ``get_logger(name)``: a module's logger whose ``debug`` is a no-op while ``logging`` is not
  imported. That is exact, not a guess: until someone imports ``logging`` nobody can have
  given it a handler or a level, so the record would be dropped (the root's level is WARNING).
- ``quiet_libraries_logging()``: a library's records (paramiko's transport thread logs a
  traceback for a node that never sends its banner) must not reach the terminal through
  logging's "last resort" handler: the root logger gets a ``NullHandler`` the moment any
  module imports ``logging``, and not before.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Optional


class LazyLogger:
    """``logging.getLogger(name)``, looked up on first use while ``logging`` is imported."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def debug(self, msg: str, *args: Any) -> None:
        if self._logger is None:
            logging = sys.modules.get("logging")
            if logging is None:
                return  # nothing configured logging: the record would go nowhere
            self._logger = logging.getLogger(self._name)
        self._logger.debug(msg, *args)


def get_logger(name: str) -> LazyLogger:
    return LazyLogger(name)


def quiet_libraries_logging() -> None:
    """Give the root logger a ``NullHandler`` now if ``logging`` is imported, else when it is."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger().addHandler(logging.NullHandler())
    elif not any(isinstance(f, _QuietWhenImported) and not f.used for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietWhenImported())


class _QuietWhenImported:
    """A meta path finder for ``logging`` alone: it finds it as the others would, and adds the
    root's ``NullHandler`` once the module has run (the pattern of setuptools' own
    ``_distutils_hack``). After that first lookup it finds nothing: it stays in
    ``sys.meta_path``, since another thread's import may be walking that list."""

    def __init__(self) -> None:
        self.used = False

    def find_spec(self, name: str, path: Optional[Sequence[str]], target: Any = None) -> Any:
        if name != "logging" or self.used:
            return None
        import importlib.util

        self.used = True  # before the lookup below, which asks this finder again
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        run_module = getattr(loader, "exec_module", None)
        if run_module is None:
            return spec

        def exec_module(module: Any) -> None:
            run_module(module)
            module.getLogger().addHandler(module.NullHandler())

        loader.exec_module = exec_module  # type: ignore[union-attr]  # this spec's own loader
        return spec
