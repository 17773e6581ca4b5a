"""gpuclaim: claim, check and run on a small team's shared GPU servers."""

from __future__ import annotations

__version__ = "0.1.0"
