"""pytest fixtures for the SSH testbed (load with ``pytest_plugins = ["testbed_fixtures"]``).

``make_testbed(n=3, gpus=4, delay_ms=0, jump=False, nvml=False)`` starts a testbed of real
sshd nodes and tears it down after the test, pass or fail; ``testbed`` is 3 nodes of 4 GPUs.
A machine without sshd fails the test with the package to install: SSH is proven in the
default run, so a missing package must not turn into a silent skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional, Protocol

import pytest
from testbed import MissingTool, Testbed


class MakeTestbed(Protocol):
    def __call__(
        self,
        n: int = 3,
        gpus: int = 4,
        delay_ms: int = 0,
        jump: bool = False,
        nvml: bool = False,
        without: tuple[str, ...] = (),
        node_env: Optional[dict[str, dict[str, str]]] = None,
        accounts: tuple[str, ...] = (),
        shared_homes: bool = False,
    ) -> Testbed: ...


@pytest.fixture
def make_testbed() -> Iterator[MakeTestbed]:
    """Factory of testbeds; every one made is torn down when the test ends."""
    made: list[Testbed] = []

    def make(
        n: int = 3,
        gpus: int = 4,
        delay_ms: int = 0,
        jump: bool = False,
        nvml: bool = False,
        without: tuple[str, ...] = (),
        node_env: Optional[dict[str, dict[str, str]]] = None,
        accounts: tuple[str, ...] = (),
        shared_homes: bool = False,
    ) -> Testbed:
        try:
            tb = Testbed.up(
                n,
                gpus=gpus,
                delay_ms=delay_ms,
                jump=jump,
                nvml=nvml,
                without=without,
                node_env=node_env,
                accounts=accounts,
                shared_homes=shared_homes,
            )
        except MissingTool as exc:
            missing = str(exc)
        else:
            made.append(tb)
            return tb
        # outside the except block: one line naming the package, no chained traceback
        pytest.fail(missing, pytrace=False)

    try:
        yield make
    finally:
        errors = []
        for tb in reversed(made):
            try:
                tb.down()
            except Exception as exc:  # tear the others down before reporting
                errors.append(exc)
        if errors:
            raise errors[0]


@pytest.fixture
def testbed(make_testbed: MakeTestbed) -> Testbed:
    """Three sshd nodes (node01..node03) of four simulated H100s each."""
    return make_testbed(3, 4)


def wrap_sshd(monkeypatch: pytest.MonkeyPatch, directory: Path, prefixes: dict[str, str]) -> None:
    """Put an ``sshd`` first on PATH that starts the sshd of each node named in ``prefixes``
    through that shell prefix (a namespace of its own: another hostname, other mounts), and
    every other sshd as it is. For testbeds whose "hosts" must differ in more than a port."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    sshd = shutil.which("sshd", path=search)
    if sshd is None:
        pytest.fail("sshd not found: apt-get install openssh-server", pytrace=False)
    cases = "".join(
        f'  */nodes/{alias}/sshd_config*) exec {prefix} {sshd} "$@" ;;\n'
        for alias, prefix in prefixes.items()
    )
    wrapper = directory / "sshd"
    directory.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in\n{cases}esac\nexec {sshd} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short private XDG_RUNTIME_DIR for the laptop's sockets, for every gpuclaim the test
    starts (the SSH masters there are the test's own); they are closed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="gcw-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(d))
    yield d
    for master in (d / "gpuclaim-cm").glob("*"):
        if master.name != "w":
            subprocess.run(
                ["ssh", "-o", f"ControlPath={master}", "-O", "exit", "x"], capture_output=True
            )
    shutil.rmtree(d, ignore_errors=True)


def looks_until_warm(c: Any, runtime: Path, nodes: int, timeout: float = 30.0) -> None:
    """Look until every node answers through its warm agent: the first look of the day is
    sh's (remote.shell_look), which installs or starts the agent behind it; a later look
    finds it up and forwards to it."""
    deadline = time.monotonic() + timeout
    while len(list((runtime / "gpuclaim-cm" / "w").glob("w-*.sock"))) < nodes:
        assert time.monotonic() < deadline, "the warm agents never came up"
        assert {r["state"] for r in c.json("status")} <= {"free", "claimed"}
        time.sleep(0.1)
