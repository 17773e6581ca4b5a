"""The agent as one zip file the CLI sends to a node (``python3 agent.pyz``), versioned by
content so a node re-receives it only when it changed."""

from __future__ import annotations

import hashlib
import io
import zipfile
from functools import lru_cache
from pathlib import Path

from gpuclaim import __version__

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def _agent_modules() -> tuple[str, ...]:
    """Everything but the faces (cli, board): the core is standard library only, so the
    node runs the same code as the laptop (probe, store, jobs, queue dispatch)."""
    names = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        if rel.split("/", 1)[0] in ("cli", "board"):
            continue
        names.append(rel)
    return tuple(names)


_MAIN = b"import sys\nfrom gpuclaim.node.main import main\nsys.exit(main())\n"
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)


@lru_cache(maxsize=1)
def agent_bundle() -> tuple[str, bytes]:
    """(version, zip bytes); the version changes whenever any bundled file does."""
    files = {f"gpuclaim/{name}": (PACKAGE_DIR / name).read_bytes() for name in _agent_modules()}
    files["__main__.py"] = _MAIN
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    version = f"{__version__}-{digest.hexdigest()[:12]}"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, files[name])
    return version, buf.getvalue()
