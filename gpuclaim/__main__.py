"""``python -m gpuclaim``."""

from __future__ import annotations

from gpuclaim.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
