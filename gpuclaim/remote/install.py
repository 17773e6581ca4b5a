"""Putting the agent on a node: the shell command and the stdin that install it and answer
the first request in one ``python3``.

Two commands, both ``sh`` the node's sshd runs:

- ``run_command``: the installed agent answers (``~/.cache/gpuclaim/agent-V.pyz``, or the
  unpacked ``agent-V/`` on a node of another Python version), or exit ``MISSING`` (117);
  then the caller sends ``install_command`` with the request, the installer and the zip on
  stdin, all at once (fabric, or any caller that cannot converse).
- ``install_command``: the installed agent answers if it is there (a racing call put it
  there); otherwise it prints ``NEED`` and installs from what follows the request on stdin.
  Over the ssh binary this is a conversation (``OpenSshPool.converse``): the request goes
  first, and the archive only when the node asks for it, so the first call of the day costs
  one SSH session either way and a node that has the agent never receives it again.

Stdin is always ``REQUEST-LINE`` first (the agent reads one line), then, for an install,
``INSTALLER`` (``len(INSTALLER)`` bytes, read by the ``-c`` loader) and ``SIZE\\n ARCHIVE``.
"""

from __future__ import annotations

import shlex

from gpuclaim.node.home import BOOT

MISSING = 117  # the agent of this version is not on the node
CANNOT_INSTALL = 118  # ~/.cache/gpuclaim cannot be written
NEED = b"gpuclaim-agent-missing\n"

CACHE = '"$HOME/.cache/gpuclaim"'

# What ``ps`` shows while a first call runs (``python3 -c LOADER LENGTH AGENT TAG ARGS``):
# short. It reads the request line, then the installer, and runs the installer.
LOADER = (
    "import sys\n"
    "r=sys.stdin.buffer;q=r.readline();n=int(sys.argv[1]);b=r.read(n)\n"
    "len(b)==n or sys.exit('the agent installer was cut short');exec(b)"
)

# The installer (run by LOADER, in its globals: ``sys``, ``r`` the stdin, ``q`` the request
# line): reads "SIZE\n" and the zip with the same buffered reader. A node whose python3 is
# the one the zip's bytecode is for keeps the zip as one file; any other unpacks the sources
# (and compiles them on first import, once). Either is made under a temporary name and
# renamed into place (atomic: a racing install of the same version just loses). Then the
# agent runs in this same interpreter on the request already read: no second Python start.
INSTALLER = """\
import io, os
size = r.readline()
blob = r.read(int(size or 0))
if not size or len(blob) != int(size):
    sys.exit("the agent archive was cut short")
agent, tag = sys.argv[2], sys.argv[3]
path = agent + ".pyz" if sys.implementation.cache_tag == tag else agent
tmp = "%s.%d.%s.tmp" % (agent, os.getpid(), os.urandom(4).hex())
if not os.path.exists(path):
    try:
        if path != agent:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(blob)
        else:
            import zipfile
            with zipfile.ZipFile(io.BytesIO(blob)) as zf:
                zf.extractall(tmp, [n for n in zf.namelist() if not n.endswith(".pyc")])
        os.rename(tmp, path)
    except (OSError, ValueError) as exc:
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.isfile(tmp):
            os.unlink(tmp)
        if not os.path.exists(path):  # not a racing install that won
            sys.stderr.write("%s\\n" % exc)
            sys.exit(118)
sys.argv = [path] + sys.argv[4:]
sys.path[0] = path
sys.stdin = io.TextIOWrapper(io.BytesIO(q), encoding="utf-8")
from gpuclaim.node.main import main
sys.exit(main())
"""


def agent_path(version: str) -> str:
    """The node's agent of ``version`` without its suffix (``.pyz``, or none: unpacked)."""
    return f'"$HOME/.cache/gpuclaim/agent-{version}"'


def _start_installed(version: str, arguments: str) -> str:
    """Shell: exec the installed agent of ``version`` if there is one (and fall through)."""
    run = f'exec python3 -c {shlex.quote(BOOT)} "$p" {arguments}'.rstrip()
    paths = f"{agent_path(version)}.pyz {agent_path(version)}"
    return f'for p in {paths}; do [ -e "$p" ] && {run}; done'


def run_command(version: str, arguments: str = "") -> str:
    """The installed agent of ``version`` answers, or exit ``MISSING``."""
    return f"{_start_installed(version, arguments)}; exit {MISSING}"


def install_command(version: str, tag: str, arguments: str = "") -> str:
    """The installed agent answers; else ``NEED`` on stdout, then install and answer."""
    loader = shlex.quote(LOADER)
    return (
        f"{_start_installed(version, arguments)}; "
        f"mkdir -p {CACHE} || exit {CANNOT_INSTALL}; echo {NEED.decode().strip()}; "
        f"exec python3 -c {loader} {len(INSTALLER)} {agent_path(version)} {tag} {arguments}"
    ).rstrip()


def install_stdin(blob: bytes) -> bytes:
    """What follows the request line when the node says ``NEED``."""
    return INSTALLER.encode() + f"{len(blob)}\n".encode() + blob
