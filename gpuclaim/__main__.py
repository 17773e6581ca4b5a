"""``python -m gpuclaim``."""

from __future__ import annotations

from gpuclaim.entry.main import main

if __name__ == "__main__":
    raise SystemExit(main())
