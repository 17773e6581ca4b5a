"""Test clusters made of real parts: a real store directory, real processes running the CLI,
and the one fake, ``nvidia-smi``, speaking the real CSV for simulated GPUs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

from gpuclaim.app.configfile import render_config

pytest_plugins = ["testbed_fixtures"]

REPO = Path(__file__).resolve().parent.parent

SSH_FIXTURES = {"testbed", "make_testbed", "make_remote"}
CLI_FIXTURES = {"cluster", "make_cluster"}
# What only root can set up: a tmpfs, a node's own mount or UTS namespace, other real users.
ROOT_FIXTURES = {"small_storage", "split_testbed", "named_testbed", "group_cluster"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tiers by what a test starts, so that e.g. ``pytest -m "not ssh and not slurm"`` is a
    quick check: ``ssh`` (real sshd nodes), ``slurm`` (a real SLURM), ``cli`` (gpuclaim in
    processes on local simulated nodes), ``root`` (needs root: ``-m "not root"`` as a user);
    ``unit`` is marked by tests/unit/conftest.py."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & ROOT_FIXTURES:
            item.add_marker(pytest.mark.root)
        if names & SSH_FIXTURES:
            item.add_marker(pytest.mark.ssh)
        elif names & CLI_FIXTURES:
            item.add_marker(pytest.mark.cli)
        if item.module is not None and item.module.__name__.endswith("test_slurm_real"):
            item.add_marker(pytest.mark.slurm)


FAST_SMI = REPO / "tests" / "assets" / "fast-nvidia-smi.sh"


@pytest.fixture(scope="session", autouse=True)
def path_without_the_project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test starts gpuclaim through ``sys.executable``; nothing may find it through PATH.

    A machine where the project's packages were once installed outside .venv lets a bare
    ``python3 -m gpuclaim`` pass here and fail on a fresh one (it did). So, for the whole
    session, PATH starts with a ``gpuclaim`` that fails loudly and a ``python3``/``python``
    that runs the system interpreter without site-packages: a test (or product code) that
    leans on PATH fails here exactly as on a fresh machine, whatever is installed globally.
    """
    shims = tmp_path_factory.mktemp("path-guard")
    real = {name: _which_outside_venv(name) for name in ("python3", "python")}
    for name, target in real.items():
        if target:
            _write_shim(shims / name, f'exec {target} -S "$@"')
    _write_shim(
        shims / "gpuclaim",
        "echo 'tests must start gpuclaim through sys.executable, not PATH' >&2; exit 97",
    )
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{shims}{os.pathsep}{old}"
    # A login shell whose profile runs `pyenv init` (this machine's root's does) rehashes
    # under a lock file; a test that SIGKILLs a node's processes can kill one mid-rehash and
    # leave the lock, and every later login shell then waits 60 s for it: past the wrapper's
    # 30 s for a login shell, so local jobs failed at once (17 tests of one CI run). Jobs'
    # login shells inherit this environment: a lock left behind costs them 2 s instead.
    rehash = os.environ.get("PYENV_REHASH_TIMEOUT")
    os.environ["PYENV_REHASH_TIMEOUT"] = "2"
    try:
        yield
    finally:
        os.environ["PATH"] = old
        if rehash is None:
            os.environ.pop("PYENV_REHASH_TIMEOUT", None)
        else:
            os.environ["PYENV_REHASH_TIMEOUT"] = rehash


def _which_outside_venv(name: str) -> Optional[str]:
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    return shutil.which(name, path=path)


def _write_shim(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def gpu(name: str = "NVIDIA H100 80GB HBM3", mem: int = 81559, **extra: Any) -> dict[str, Any]:
    return {"name": name, "memory_total_mib": mem, **extra}


class CliDriver:
    """Runs the real ``gpuclaim`` in new processes, as a user at a terminal would."""

    home: Path
    config_path: Path

    def env(self, user: str = "alice", **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCLAIM_")}
        env.update(
            GPUCLAIM_HOME=str(self.home),
            GPUCLAIM_CONFIG=str(self.config_path),
            GPUCLAIM_USER=user,
            NO_COLOR="1",
        )
        env.update(extra)
        return env

    def cli(
        self,
        *args: str,
        user: str = "alice",
        timeout: float = 60,
        cwd: Optional[Path] = None,
        **env: str,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``gpuclaim ARGS`` in a new process, as a user would: typed in ``cwd`` (the
        driver's home unless said; a job runs in that directory when its node has it)."""
        return subprocess.run(
            [sys.executable, "-m", "gpuclaim", *args],
            env=self.env(user, **env),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            cwd=cwd or self.home,
        )

    def python(
        self, code: str, *args: str, user: str = "alice"
    ) -> subprocess.CompletedProcess[str]:
        """``python -c CODE ARGS`` as this driver's user would run gpuclaim (a probe of what a
        call imports, the CLI with a part switched off)."""
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            env=self.env(user),
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            cwd=self.home,
        )

    def ok(self, *args: str, user: str = "alice") -> str:
        proc = self.cli(*args, user=user)
        assert proc.returncode == 0, (
            f"gpuclaim {' '.join(args)} -> {proc.returncode}\n{proc.stderr}"
        )
        return proc.stdout

    def json(self, *args: str, user: str = "alice", expect: int = 0) -> Any:
        # --json belongs to gpuclaim, before a job's own "-- CMD ARGS"
        if "--" in args:
            cut = args.index("--")
            args = (*args[:cut], "--json", *args[cut:])
        else:
            args = (*args, "--json")
        proc = self.cli(*args, user=user)
        assert proc.returncode == expect, f"{args} -> {proc.returncode}: {proc.stderr}"
        return json.loads(proc.stdout)

    def status(self, user: str = "alice") -> list[dict[str, Any]]:
        return self.json("status", user=user)

    def by_gpu(self, user: str = "alice") -> dict[tuple[str, int], dict[str, Any]]:
        return {(r["node"], r["index"]): r for r in self.status(user)}


@dataclass
class SimCluster(CliDriver):
    """A gpuclaim cluster of local nodes with simulated GPUs, driven through the real CLI."""

    root: Path
    nodes: dict[str, list[dict[str, Any]]]
    defaults: dict[str, Any] = field(default_factory=dict)
    fast: bool = False  # a shell fake that replays recorded CSV: ~1 ms instead of ~40 ms

    def __post_init__(self) -> None:
        self.home = self.root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        # its "nodes" are this machine: a tmux server of its own, as each testbed node has,
        # or two tests' jobs of one name (gc-alice-api) would be one session: one test's
        # kill stopped the other's service (a crash-looping service ended "killed")
        self.tmux_dir = self.root / "tmux"
        self.tmux_dir.mkdir(mode=0o700, exist_ok=True)
        self.state_path = self.root / "gpus.json"
        self.storage = self.root / "store"
        self.storage.mkdir(mode=0o2775)  # as an admin makes a store's directory
        self.config_path = self.root / "config.toml"
        self.write_state()
        self.write_config()

    # -- set-up ---------------------------------------------------------------------------------
    def write_state(self) -> None:
        state = {
            "driver_version": "550.54.15",
            "nodes": {n: {"gpus": g} for n, g in self.nodes.items()},
        }
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_path)
        if self.fast:
            self._record_fast_outputs()

    def _record_fast_outputs(self) -> None:
        for node in self.nodes:
            out = subprocess.run(
                [sys.executable, "-m", "gpuclaim.sim.fake_nvidia_smi", "-q", "-x"],
                env={**os.environ, **self.node_env(node)},
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            (self.root / f"{node}.q.xml").write_text(out)

    def node_env(self, node: str) -> dict[str, str]:
        return {"GPUCLAIM_NODE": node, "GPUCLAIM_SIM_STATE": str(self.state_path)}

    def env(self, user: str = "alice", **extra: str) -> dict[str, str]:
        return super().env(user, **{"TMUX_TMPDIR": str(self.tmux_dir), **extra})

    def stop_tmux(self) -> None:
        """End this cluster's own tmux server (its jobs' sessions), by its socket."""
        tmux = shutil.which("tmux")
        for sock in self.tmux_dir.glob("tmux-*/*"):
            if tmux is not None and sock.is_socket():
                subprocess.run([tmux, "-S", str(sock), "kill-server"], capture_output=True)

    def write_config(self, **overrides: Any) -> None:
        if self.fast:
            smi = ["sh", str(FAST_SMI), str(self.root)]
        else:
            smi = [sys.executable, "-m", "gpuclaim.sim.fake_nvidia_smi"]
        settings = {
            n: {
                "host": "localhost",
                "transport": "local",
                "nvidia_smi": smi,
                "env": self.node_env(n),
            }
            for n in self.nodes
        }
        text = render_config(
            cluster="test",
            nodes=list(self.nodes),
            storage=str(self.storage),
            node_settings=settings,
            defaults={**self.defaults, **overrides},
        )
        self.config_path.write_text(text)


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Any]:
    made: list[SimCluster] = []

    def make(
        nodes: Optional[dict[str, Any]] = None, fast: bool = False, **defaults: Any
    ) -> SimCluster:
        spec = nodes or {"node01": 4}
        expanded = {
            n: ([gpu() for _ in range(g)] if isinstance(g, int) else g) for n, g in spec.items()
        }
        cluster = SimCluster(tmp_path / f"c{len(made)}", expanded, defaults, fast)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:  # a queue keeper left waiting on a local node stops with its store
        cluster.stop_tmux()
        shutil.rmtree(cluster.storage, ignore_errors=True)


@pytest.fixture
def cluster(make_cluster: Any) -> SimCluster:
    """Two nodes: node01 with 4 H100s, node02 with 2 L40S."""
    return make_cluster({"node01": 4, "node02": [gpu("NVIDIA L40S", 46068) for _ in range(2)]})


class RemoteCluster(CliDriver):
    """A gpuclaim config whose nodes are a real sshd testbed, used from this "laptop"."""

    def __init__(
        self,
        root: Path,
        testbed: Any,
        storage: Optional[str] = None,
        nodes: Optional[list[str]] = None,
        extra_toml: str = "",
        ssh_client: Optional[str] = None,
        **defaults: Any,
    ) -> None:
        self.root = root
        self.testbed = testbed
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.storage = root / "store"
        self.storage.mkdir(mode=0o2775)  # as an admin makes a store's directory
        self.config_path = root / "config.toml"
        self.nodes = nodes or list(testbed.nodes)
        text = render_config(
            cluster="tb",
            nodes=self.nodes,
            storage=storage or str(self.storage),
            ssh_config=str(testbed.ssh_config),
            defaults={"connect_timeout": "3s", "deadline": "15s", **defaults},
        )
        if ssh_client:
            text = text.replace("\nnodes = ", f'\nssh_client = "{ssh_client}"\nnodes = ', 1)
        self.config_path.write_text(text + extra_toml)
        self.config_path.chmod(0o600)

    def env(self, user: str = "alice", **extra: str) -> dict[str, str]:
        env = super().env(user, **extra)
        env.pop("GPUCLAIM_SSH_CONFIG", None)
        return env


@pytest.fixture
def make_remote(tmp_path: Path) -> Iterator[Any]:
    made: list[RemoteCluster] = []

    def make(testbed: Any, **kwargs: Any) -> RemoteCluster:
        cluster = RemoteCluster(tmp_path / f"r{len(made) + 1}", testbed, **kwargs)
        made.append(cluster)
        return cluster

    yield make
    # Queue keepers on the nodes wait while a job of theirs waits; one left queued by a test
    # (a --begin hours ahead) stops with its store, not in a later test that counts keepers.
    for cluster in made:
        shutil.rmtree(cluster.storage, ignore_errors=True)
