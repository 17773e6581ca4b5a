"""Digests for names (sockets, cached files, the agent's version) without importing
``hashlib``: it loads OpenSSL (~3 ms, a few percent of a first call), while CPython's own
modules (``_sha1``; ``_sha256`` up to 3.11, ``_sha2`` since) give the same digests for ~0.3
ms. Where a build lacks them (some FIPS builds), ``hashlib``'s: the same bytes either way."""

from __future__ import annotations

import importlib
from typing import Any


def _constructor(name: str, modules: tuple[str, ...]) -> Any:
    for module in modules:
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
    return getattr(importlib.import_module("hashlib"), name)


def sha1_hex(data: bytes) -> str:
    """``hashlib.sha1(data).hexdigest()``."""
    return str(_constructor("sha1", ("_sha1",))(data).hexdigest())


def sha256() -> Any:
    """A new ``hashlib.sha256()``-like object (``update``, ``hexdigest``)."""
    return _constructor("sha256", ("_sha256", "_sha2"))()
