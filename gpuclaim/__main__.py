"""``python -m gpuclaim``."""

from __future__ import annotations

from gpuclaim.entry.main import run

if __name__ == "__main__":
    run()
