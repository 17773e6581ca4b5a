"""The environment a job's command starts in on its node: the user's login environment (what
their ``$SHELL -l`` sets up from ``~/.profile``, ``~/.bash_profile``, ``~/.zprofile``: PATH
additions such as ``~/.local/bin`` or conda's ``condabin``, module systems, variables), then a
conda env activated through the node's conda/mamba/micromamba, or a Python venv.

The command itself never goes through a shell: the login shell runs once, prints its
environment (``env -0``, NUL-separated, or as JSON from this same Python where ``env`` has no
``-0``; after a marker, so that a chatty profile cannot confuse it), and the wrapper starts
the exact argv with that environment, as before. That keeps
the argv exact and the "cannot start 'x' (not on the PATH there)" message, and is the way
editors pick up a login environment. Standard library only, Python 3.9.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path
from typing import Optional

from gpuclaim.core.errors import GpuclaimError

LOGIN_TIMEOUT_S = 30.0
# Shells that take ``-l -c SCRIPT ARG0 ARGS`` with POSIX syntax. Others (fish, csh, tcsh, nu)
# get /bin/sh -l, which reads ~/.profile.
POSIX_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "yash", "ash", "busybox"})
MARKER = "\0gpuclaim-env\0"  # then the environment as JSON (Python's dump)
MARKER_ENV0 = "\0gpuclaim-env0\0"  # then env -0's NUL-separated NAME=value entries
_DUMP = f"import json,os,sys;sys.stdout.write({MARKER!r}+json.dumps(dict(os.environ)))"
# $0: this Python, $1: the dump code, $2: the conda env to activate ("" for none). env -0
# costs no second Python start on the node (every job start pays this); Python dumps it
# where env lacks -0 (BusyBox).
_SCRIPT = """\
if [ -n "$2" ]; then
  gc_tool=
  for t in conda mamba micromamba; do
    if command -v "$t" >/dev/null 2>&1; then gc_tool=$t; break; fi
  done
  if [ -z "$gc_tool" ]; then
    echo "no conda, mamba or micromamba on the PATH of a login shell" >&2; exit 3
  fi
  if [ "$gc_tool" = conda ]; then gc_hook=$(conda shell.posix hook)
  else gc_hook=$("$gc_tool" shell hook -s posix); fi || {
    echo "$gc_tool cannot print its shell hook" >&2; exit 3; }
  eval "$gc_hook"
  "$gc_tool" activate "$2" >&2 || {
    echo "conda env '$2' cannot be activated with $gc_tool (does it exist?)" >&2; exit 4; }
fi
printf '\\000gpuclaim-env0\\000'
env -0 2>/dev/null && exit 0
exec "$0" -c "$1"
"""


def login_shell() -> str:
    """The user's login shell if it speaks POSIX sh, else /bin/sh."""
    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        shell = ""
    shell = shell or os.environ.get("SHELL") or "/bin/sh"
    return shell if Path(shell).name in POSIX_SHELLS else "/bin/sh"


def job_environment(
    base: dict[str, str],
    node: str,
    login: bool,
    venv: Optional[str],
    conda: Optional[str],
    workdir: str,
    shell: Optional[ShellRun] = None,
) -> dict[str, str]:
    """``base`` as the login shell and the conda env leave it, then with the venv first on
    PATH. A venv path that is relative is the job's workdir's (``--venv .venv``). ``shell``:
    that shell, started earlier (``ShellRun.start`` with the same ``base``, ``login``,
    ``conda``) while the wrapper readied the rest."""
    env = dict(base)
    if login or conda:
        env = (shell or ShellRun.login(env, login, conda or "")).result(node)
    if venv:
        env = with_venv(env, venv, node, workdir)
    return env


def with_venv(env: dict[str, str], venv: str, node: str, workdir: str) -> dict[str, str]:
    path = Path(os.path.normpath(Path(workdir) / Path(venv).expanduser()))
    if not (path / "bin" / "python").is_file():
        what = "has no bin/python" if path.exists() else "does not exist"
        raise GpuclaimError(f"venv {venv} {what} on {node}")
    env = dict(env)
    env.pop("PYTHONHOME", None)  # as bin/activate does
    env["VIRTUAL_ENV"] = str(path)
    env["PATH"] = os.pathsep.join([str(path / "bin"), env.get("PATH", "")]).rstrip(":")
    return env


class ShellRun:
    """The login shell (and conda's activation) printing its environment: started, and read
    later, so the job's wrapper readies itself while the user's profile runs (on a real
    cluster that profile, conda's init among it, is often the longer of the two). A plain
    login shell's result is kept (``login_cache``) and reused while the profiles stay as
    they were: then no shell runs at all."""

    def __init__(self, proc: Optional[subprocess.Popen[bytes]], said: str, failed: str) -> None:
        self.proc = proc
        self.said = said  # "bash -l", "sh": for messages
        self.failed = failed  # why it could not start, if it did not
        self.conda = False
        self.ready: Optional[dict[str, str]] = None  # the environment, from the cache
        self.keep: Optional[tuple[str, dict[str, str]]] = None  # (cache key, base) to save

    @classmethod
    def login(cls, env: dict[str, str], login: bool, conda: str) -> ShellRun:
        """``start``, or the kept result of the same login shell over the same profiles."""
        if not login or conda:
            return cls.start(env, login, conda)
        from gpuclaim.node.login_cache import cache_key, load

        shell = login_shell()
        key = cache_key(env, shell)
        kept = load(key, env) if key else None
        if kept is not None:
            run = cls(None, f"{Path(shell).name} -l", "")
            run.ready = kept
            return run
        run = cls.start(env, login, conda)
        run.keep = (key, env) if key else None
        return run

    @classmethod
    def start(cls, env: dict[str, str], login: bool, conda: str) -> ShellRun:
        shell = login_shell() if login else "/bin/sh"
        argv = [shell, *(["-l"] if login else []), "-c", _SCRIPT, sys.executable, _DUMP, conda]
        said = f"{Path(shell).name} -l" if login else "sh"
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=str(Path.home()),
            )
        except OSError as exc:
            run = cls(None, said, f"cannot start the login shell {shell}: {exc}")
        else:
            run = cls(proc, said, "")
        run.conda = bool(conda)
        return run

    def result(self, node: str) -> dict[str, str]:
        """The environment it printed, or ``GpuclaimError`` saying why there is none."""
        if self.ready is not None:
            return dict(self.ready)
        env = self._printed(node)
        if self.keep is not None:
            from gpuclaim.node.login_cache import save

            save(self.keep[0], self.keep[1], env)
        return env

    def _printed(self, node: str) -> dict[str, str]:
        if self.proc is None:
            raise GpuclaimError(f"{self.failed} on {node}")
        try:
            stdout, stderr = self.proc.communicate(timeout=LOGIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            raise GpuclaimError(
                f"the login shell ({self.said}) did not finish within {LOGIN_TIMEOUT_S:.0f}s on "
                f"{node} (a profile waiting for input?): set login_shell = false for this node"
            ) from None
        out = stdout.decode("utf-8", "replace")
        code = self.proc.returncode
        if code != 0 or (MARKER not in out and MARKER_ENV0 not in out):
            lines = stderr.decode("utf-8", "replace").strip().splitlines()
            why = lines[-1] if lines else f"exit status {code}"
            if self.conda and code in (3, 4):
                raise GpuclaimError(f"{why} on {node}")
            raise GpuclaimError(f"the login shell ({self.said}) failed on {node}: {why}")
        try:
            found = _dumped(out)
        except ValueError as exc:
            raise GpuclaimError(
                f"the login shell's environment on {node} is unreadable: {exc}"
            ) from None
        # what the shell itself set about its own run, not the job's
        return {str(k): str(v) for k, v in found.items() if k not in _SHELL_OWN}

    def stop(self) -> None:
        """Not needed after all (the workdir is missing, the wrapper failed): gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def _shell_environment(env: dict[str, str], node: str, login: bool, conda: str) -> dict[str, str]:
    return ShellRun.start(env, login, conda).result(node)


def _dumped(out: str) -> dict[str, str]:
    """The environment after the last marker: Python's JSON if it had to dump it (env has no
    -0), else env -0's entries."""
    if MARKER in out:
        found = json.loads(out.rsplit(MARKER, 1)[1])
        if not isinstance(found, dict):
            raise ValueError("not a JSON object")
        return {str(k): str(v) for k, v in found.items()}
    entries = out.rsplit(MARKER_ENV0, 1)[1].split("\0")
    pairs = [entry.partition("=") for entry in entries if entry]
    if any(not sep for _, sep, _ in pairs):
        raise ValueError("an entry without '='")
    return {name: value for name, _, value in pairs}


_SHELL_OWN = frozenset({"_", "SHLVL", "OLDPWD", "PWD"})
