"""Is Ray in a ``run --ray`` job's environment on this node? Asked before anything is claimed,
in the environment the job would get (its venv, conda env or login shell, as the wrapper
makes it), so a node without Ray is one line at submit, not a failed job. Standard library
only, Python 3.9.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from gpuclaim.core.errors import GpuclaimError

if TYPE_CHECKING:
    from gpuclaim.core.protocol import RayCheckResponse, WorkEnvSpec

_VERSION = "from importlib.metadata import version; print(version('ray'))"


def ray_check(workenv: WorkEnvSpec, workdir: Optional[str]) -> RayCheckResponse:
    from gpuclaim.node.ray_node import interpreter
    from gpuclaim.node.workenv import job_environment

    node = socket.gethostname()
    where = workdir if workdir and Path(workdir).is_dir() else str(Path.home())
    try:
        env = job_environment(
            dict(os.environ),
            node,
            login=bool(workenv["login_shell"]),
            venv=workenv["venv"],
            conda=workenv["conda"],
            workdir=where,
        )
    except GpuclaimError as exc:
        return {"version": None, "problem": exc.message}
    ray = shutil.which("ray", path=env.get("PATH"))
    if ray is None:
        return {"version": None, "problem": f"no ray in {_what(workenv)} (pip install ray there)"}
    try:
        done = subprocess.run(
            [interpreter(ray), "-c", _VERSION], capture_output=True, text=True, timeout=30, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"version": None, "problem": f"{ray} does not start: {exc}"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"version": None, "problem": f"{ray} does not start: {last}"}
    return {"version": done.stdout.strip(), "problem": ""}


def _what(workenv: WorkEnvSpec) -> str:
    if workenv["venv"]:
        return f"the venv {workenv['venv']}"
    if workenv["conda"]:
        return f"the conda env {workenv['conda']}"
    return "the job's PATH"
