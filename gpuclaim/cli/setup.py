"""``gpuclaim init`` (write a config) and ``gpuclaim demo`` (a sandbox with simulated GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from gpuclaim.cli.common import err, out, state
from gpuclaim.core import paths
from gpuclaim.core.durations import parse_duration
from gpuclaim.core.errors import GpuclaimError, UsageError


def init(
    ctx: typer.Context,
    nodes: Optional[str] = typer.Option(
        None, "--nodes", help="Comma-separated SSH host aliases (localhost = this machine)."
    ),
    storage: Optional[str] = typer.Option(
        None, "--storage", help="Shared directory for claims, or ssh://HOST/PATH."
    ),
    cluster: str = typer.Option("gpuclaim", "--cluster", help="A name for this cluster."),
    user: Optional[str] = typer.Option(None, "--user", help="Your name, if not your login."),
    ssh_config: Optional[str] = typer.Option(None, "--ssh-config", help="An ssh_config file."),
    default_time: Optional[str] = typer.Option(None, "--time", help="Default claim length."),
    max_time: Optional[str] = typer.Option(None, "--max-time", help="Longest claim allowed."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", min=0, help="GPUs per user."),
    slack_webhook: Optional[str] = typer.Option(None, "--slack-webhook", help="Webhook URL."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing config."),
) -> None:
    """Write a config file and make the store (asks for what is missing in a terminal)."""
    from gpuclaim.app.configfile import render_config
    from gpuclaim.core.config import LOCAL_NAMES

    target = state(ctx).config_path or paths.config_path()
    if target.exists() and not force:
        raise GpuclaimError(f"{target} exists", hint="use --force to overwrite it")
    interactive = sys.stdin.isatty()
    if nodes is None:
        nodes = (
            typer.prompt("Nodes (comma-separated SSH aliases)", default="localhost")
            if interactive
            else "localhost"
        )
    node_list = [n.strip() for n in nodes.split(",") if n.strip()]
    if not node_list:
        raise UsageError("--nodes needs at least one host")
    remote = [n for n in node_list if n not in LOCAL_NAMES]
    if storage is None:
        storage = _ask_storage(remote, interactive)
    defaults: dict[str, object] = {}
    for key, value in (("time", default_time), ("max_time", max_time)):
        if value is not None:
            parse_duration(value)
            defaults[key] = value
    if max_gpus is not None:
        defaults["max_gpus_per_user"] = max_gpus
    text = render_config(
        cluster=cluster,
        nodes=node_list,
        storage=storage,
        user=user,
        ssh_config=ssh_config,
        defaults=defaults,
        slack_webhook=slack_webhook,
    )
    _write_private(target, text)
    made = _make_store(storage, remote)
    out().print(f"Wrote {target}{made}. Next: 'gpuclaim doctor', then 'gpuclaim status'.")


def _ask_storage(remote: list[str], interactive: bool) -> str:
    """The store's place when --storage was not given: asked in a terminal; with remote
    nodes there is no default (this machine's own directory is a store they never see)."""
    if remote:
        if not interactive:
            raise UsageError(
                "--storage is needed with remote nodes: a directory every node and this "
                f"machine mount at the same path, or ssh://{remote[0]}/srv/gpuclaim"
            )
        return str(
            typer.prompt(
                "Shared storage (a directory every node mounts at this path, "
                f"or ssh://{remote[0]}/srv/gpuclaim)"
            )
        )
    default_storage = str(paths.data_dir() / "store")
    if not interactive:
        return default_storage
    return str(typer.prompt("Storage directory", default=default_storage))


def _write_private(target: Path, text: str) -> None:
    """The config, readable by its owner only: it may hold the Slack webhook (a secret)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise GpuclaimError(
            f"cannot write the config {target}: {exc.strerror}",
            hint="name another file with --config or $GPUCLAIM_CONFIG",
        ) from exc


def _make_store(storage: str, remote: list[str]) -> str:
    """init is where a store's directory is made (every other command refuses a missing one:
    a typo must not start a second, private store). ssh:// storage is made on its host by the
    first command that reaches it, inside the directory the admin made there."""
    from gpuclaim.store import ClaimStore

    if storage.startswith("ssh://"):
        return ""
    root = Path(storage).expanduser()
    try:
        ClaimStore(root).ensure(create=True)
    except GpuclaimError as exc:
        raise GpuclaimError(
            f"wrote the config, but cannot make the store: {exc.message}",
            hint=f"as an admin: mkdir -p {root} && chgrp YOURGROUP {root} && chmod 2775 {root}",
        ) from exc
    where = " on every node" if remote else ""
    return f" and the store {root} (it must be this same directory{where})"


def demo(
    ctx: typer.Context,
    directory: Optional[Path] = typer.Option(
        None, "--dir", help="Where to put the sandbox (default: in gpuclaim's data dir)."
    ),
    reset: bool = typer.Option(False, "--reset", help="Start the sandbox over."),
    tour: bool = typer.Option(True, "--tour/--no-tour", help="Run a short guided tour."),
) -> None:
    """A sandbox with simulated GPUs on this machine: try everything without a cluster."""
    from gpuclaim.app.sandbox import create_sandbox

    where = directory or paths.data_dir() / "demo"
    try:
        config_path = create_sandbox(where, reset=reset)
    except OSError as exc:
        raise GpuclaimError(
            f"cannot make the demo sandbox in {where}: {exc.strerror}",
            hint="choose another directory with --dir",
        ) from exc
    console = out()
    console.print(f"Demo sandbox: {config_path}")
    if tour:
        # as the user, under their own name: what the tour claims is theirs afterwards too
        env = dict(os.environ, GPUCLAIM_CONFIG=str(config_path))
        steps = [
            ["status"],
            ["claim", "-n", "2", "--time", "2h", "--note", "demo: fine-tune"],
            ["status"],
            ["release", "--all"],
            ["history"],
        ]
        for argv in steps:
            console.print(f"\n[bold]$ gpuclaim {' '.join(_quote(a) for a in argv)}[/bold]")
            sys.stdout.flush()
            proc = subprocess.run([sys.executable, "-m", "gpuclaim", *argv], env=env)
            if proc.returncode not in (0, 4):
                err().print(f"demo step failed with exit code {proc.returncode}")
                raise typer.Exit(proc.returncode)
    console.print(
        "\nTry it yourself:\n" + _path_hint() + f"  export GPUCLAIM_CONFIG={config_path}\n"
        "  gpuclaim status\n"
        "  gpuclaim claim -n 1 --time 30m --note 'my experiment'\n"
        "  gpuclaim release --all",
        soft_wrap=True,  # a path longer than the terminal stays one line to copy
    )


def _path_hint() -> str:
    """The line that puts this gpuclaim on PATH, when a shell would not find it (the README's
    quick start installs into a virtualenv that is not activated)."""
    import shutil

    script = Path(sys.executable).parent / "gpuclaim"
    found = shutil.which("gpuclaim")
    if not script.exists() or (found and Path(found).resolve() == script.resolve()):
        return ""
    bin_dir = _short_path(script.parent)
    if sys.prefix != sys.base_prefix and (script.parent / "activate").exists():
        return f"  . {bin_dir}/activate        # puts gpuclaim on your PATH\n"
    return f'  export PATH="{bin_dir}:$PATH"   # puts gpuclaim on your PATH\n'


def _short_path(path: Path) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def _quote(arg: str) -> str:
    return f"'{arg}'" if " " in arg else arg
