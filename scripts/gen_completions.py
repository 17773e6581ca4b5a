#!/usr/bin/env python3
"""Regenerate what shell completion is made of, from the app itself:

- ``gpuclaim/cli/completion_spec.py``: the command tree the fast completion path reads;
- ``completions/``: the bash, zsh and fish scripts (also what --install-completion writes).

Run it after adding or changing a command or an option; ``tests/test_completions.py`` fails
while either is stale. ``--check`` only reports (exit 1 when something is out of date).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def generated() -> dict[Path, str]:
    """Every generated file and the text it should have."""
    from gpuclaim.cli.completion import SCRIPT_NAMES, build_spec, render_spec_module, script
    from gpuclaim.entry.main import build_app

    files = {
        REPO / "gpuclaim" / "cli" / "completion_spec.py": render_spec_module(
            build_spec(build_app())
        )
    }
    for shell, name in SCRIPT_NAMES.items():
        files[REPO / "completions" / name] = script(shell)
    return files


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    stale = []
    for path, text in generated().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path.relative_to(REPO)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
