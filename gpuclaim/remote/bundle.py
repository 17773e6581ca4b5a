"""The agent as one zip file the CLI sends to a node, versioned by content so a node
re-receives it only when it changed.

A node whose ``python3`` is the CLI's version keeps it as that one file and imports from it
(``zipimport``): one file written on a first call, not a hundred (creating them was most of
an install's CPU), and the zip carries each module's bytecode for that version next to its
source (``a/b.pyc``, where ``zipimport`` looks), so nothing is compiled there. A node of
another version unpacks the sources instead (``remote.install``) and compiles them once.

It holds exactly what the node side needs: the modules ``gpuclaim.node.main`` imports,
directly or not, function-local imports included (found by reading their source), with the
packages above them, and ``vendor/pynvml.py`` (nvidia-ml-py, when this environment has it).
Nothing of the faces, the wiring, SSH or the SLURM export goes along.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import marshal
import os
import re
import sys
import threading
from functools import lru_cache
from pathlib import Path

from gpuclaim import __version__
from gpuclaim.core.paths import data_dir
from gpuclaim.node.probe.nvml import VENDORED

PACKAGE_DIR = Path(__file__).resolve().parent.parent
ENTRY = "gpuclaim.node.main"


def module_path(module: str) -> Path | None:
    """The source file of a gpuclaim module (a package's ``__init__.py``), if there is one."""
    rel = Path(*module.split(".")[1:])
    for candidate in (PACKAGE_DIR / rel / "__init__.py", PACKAGE_DIR / f"{rel}.py"):
        if candidate.is_file():
            return candidate
    return None


# ``from X import a, b`` (parentheses may span lines) and ``import X``: read with a regular
# expression, not ast, because every CLI process that talks to a node needs the version
# (parsing the node side's modules with ast costs ~0.15 s; this costs a few ms).
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)", re.M)


def _imports_of(module: str, path: Path) -> set[str]:
    """The gpuclaim modules a file imports anywhere in it (``from x import name`` counts as
    ``x.name`` when that is a module, else as ``x``)."""
    text = path.read_text("utf-8")
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for line in _IMPORT.findall(text):
        found.update(part.split()[0] for part in line.split(",") if part.strip())
    for base, names in _FROM.findall(text):
        dots = len(base) - len(base.lstrip("."))
        if dots:
            parts = package.split(".")[: len(package.split(".")) - dots + 1]
            rest = base.lstrip(".")
            base = ".".join([*parts, rest] if rest else parts)
        found.add(base)
        for name in names.strip("()").replace("\n", " ").split(","):
            words = name.split()
            if words and words[0] != "#":
                found.add(f"{base}.{words[0]}")
    return {m for m in found if m.split(".")[0] == "gpuclaim" and module_path(m) is not None}


def agent_modules(entry: str = ENTRY) -> tuple[str, ...]:
    """Paths (relative to the package) of every module the node side can import."""
    seen: set[str] = set()
    todo = [entry]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # its packages
        path = module_path(module)
        if path is not None:
            todo.extend(_imports_of(module, path) - seen)
    paths = {module_path(m) for m in seen}
    return tuple(sorted(p.relative_to(PACKAGE_DIR).as_posix() for p in paths if p is not None))


_MAIN = f"import sys\nfrom {ENTRY} import main\nsys.exit(main())\n".encode()

# Made once per version in the data dir; the fan-out's threads ask for them at once
_MAKING = threading.RLock()
_INSTALL_INPUTS: dict[tuple[str, bytes], Path] = {}  # (version, request) -> its file
_FIXED_TIME = (2020, 1, 1, 0, 0, 0)


def vendored_nvml() -> Path | None:
    """This environment's ``pynvml`` (nvidia-ml-py, BSD-3), which the bundle carries so that
    a node with a driver but without the bindings still reads NVML in-process."""
    spec = importlib.util.find_spec("pynvml")  # found, not imported: the CLI stays light
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None


@lru_cache(maxsize=1)
def _bundle_files() -> tuple[tuple[str, bytes], ...]:
    files = {f"gpuclaim/{name}": (PACKAGE_DIR / name).read_bytes() for name in agent_modules()}
    files["__main__.py"] = _MAIN
    nvml = vendored_nvml()
    if nvml is not None:
        files[f"{VENDORED}/pynvml.py"] = nvml.read_bytes()
    return tuple(sorted(files.items()))


@lru_cache(maxsize=1)
def agent_version() -> str:
    """Changes whenever any bundled file does: what every call to a node names. Hashing
    the bundle's files takes ~18 ms, on every command that talks to a node, so the answer is
    kept in the data dir under a stamp of the package's sources (their stat: ~1 ms)."""
    stamp = _sources_stamp()
    memo = data_dir() / "bundles" / "version.json"
    with contextlib.suppress(OSError, ValueError, TypeError):
        known = json.loads(memo.read_text("utf-8"))
        if known["stamp"] == stamp and isinstance(known["version"], str):
            return str(known["version"])
    version = _hashed_version()
    with contextlib.suppress(OSError):  # a cache: a read-only home only makes it slower
        memo.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(memo, json.dumps({"stamp": stamp, "version": version}).encode())
    return version


def _hashed_version() -> str:
    from gpuclaim.core.digests import sha256

    digest = sha256()
    for name, data in _bundle_files():
        digest.update(name.encode() + b"\0" + data + b"\0")
    return f"{__version__}-{digest.hexdigest()[:12]}"


def _sources_stamp() -> str:
    """What changes whenever a file the bundle could hold does: the path, inode, size and
    mtime of every source in the package and of the vendored pynvml (an edit, a reinstall,
    a checkout all change one), and this gpuclaim's version. Kept whole (some 30 KB), not
    hashed: compared as it is, it needs no hashlib before the first contacts are spawned."""
    parts = [f"{__version__}\0{PACKAGE_DIR}"]
    folders = [str(PACKAGE_DIR)]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                    folders.append(entry.path)
                elif entry.name.endswith(".py"):
                    st = entry.stat()
                    parts.append(f"{entry.path}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}")
    nvml = vendored_nvml()
    if nvml is not None:
        st = nvml.stat()
        parts.append(f"{nvml}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}")
    return "\n".join(parts)


def _bytecode(name: str, source: bytes) -> tuple[str, bytes] | None:
    """The ``.pyc`` of one bundled source for this interpreter's version, at the place
    ``zipimport`` looks for it (``a/b.py`` -> ``a/b.pyc``). Unchecked: the zip never changes
    under its name (the name is its content's hash), so no source needs hashing on import;
    another Python version finds a foreign magic number and falls back to the source."""
    if not name.endswith(".py") or sys.implementation.cache_tag is None:
        return None
    try:
        code = compile(source, name, "exec", dont_inherit=True)
    except SyntaxError:
        return None
    flags = 0b01  # hash-based, not checked against the source
    header = importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little")
    return name + "c", header + importlib.util.source_hash(source) + marshal.dumps(code)


def bytecode_tag() -> str:
    """Which Python the bundle's bytecode is for (``cpython-311``): a node of that version
    keeps the zip as it is."""
    return sys.implementation.cache_tag or "none"


@lru_cache(maxsize=1)
def agent_bundle() -> tuple[str, bytes]:
    """(version, zip bytes): made only when a node has to receive it, and kept in the data
    dir (compiling it costs ~0.3 s, once per version instead of once per first call)."""
    version = agent_version()
    cached = data_dir() / "bundles" / f"agent-{version}.{bytecode_tag()}.zip"
    try:
        return version, cached.read_bytes()
    except OSError:
        pass
    with _MAKING:  # the fan-out's threads: one builds, the others read what it wrote
        with contextlib.suppress(OSError):
            return version, cached.read_bytes()
        blob = _build_bundle()
        with contextlib.suppress(OSError):  # a cache: a read-only home only makes it slower
            cached.parent.mkdir(parents=True, exist_ok=True)
            for old in cached.parent.glob("agent-*.zip"):
                old.unlink(missing_ok=True)
            _write_whole(cached, blob)
    return version, blob


def install_input(request: bytes) -> Path:
    """A file holding what an install command reads (``remote.install``): ``request`` (one
    line), the installer and the archive; made once per version, for installs that run on
    after the command that started them (``WarmAgents``)."""
    version = agent_version()
    with _MAKING:  # every node's look that found no agent asks at once, from its thread
        known = _INSTALL_INPUTS.get((version, request))
        if known is not None and known.exists():
            return known  # each node's look asks: the file is named and checked once
        from gpuclaim.remote import install

        _, blob = agent_bundle()
        # named by all it holds: the installer is not in the bundle's version (a checkout
        # whose remote/install.py changed would go on sending the old one)
        data = request.rstrip(b"\n") + b"\n" + install.install_stdin(blob)
        from gpuclaim.core.digests import sha1_hex

        digest = sha1_hex(data)[:12]
        path = data_dir() / "bundles" / f"agent-{version}.{bytecode_tag()}.{digest}.install"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            for old in path.parent.glob("agent-*.install"):
                if not old.name.startswith(f"agent-{version}."):
                    old.unlink(missing_ok=True)
            _write_whole(path, data)
        _INSTALL_INPUTS[(version, request)] = path
    return path


def _write_whole(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held: written beside it and renamed, under a name
    of this process and thread (another command, or another thread of this one, may be
    writing the same file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def _build_bundle() -> bytes:
    import io
    import zipfile  # here: only a new version's first call builds the zip

    files = dict(_bundle_files())
    for name, data in list(files.items()):
        compiled = _bytecode(name, data)
        if compiled is not None:
            files[compiled[0]] = compiled[1]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return buf.getvalue()
