"""The ``gpuclaim`` app: command registration, and the one place where errors become a
one-line message and an exit code.

The app is built on first use, not at import: shell completion (``_GPUCLAIM_COMPLETE``) is
answered by ``main()`` before typer or any command is imported, in a few milliseconds."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any, NoReturn, Optional

if TYPE_CHECKING:
    import typer

COMPLETE_VAR = "_GPUCLAIM_COMPLETE"  # set by the completion scripts (completion_scripts.py)


# Every top-level command: (module, attribute, how it is registered). A group (a Typer of
# its own) is marked by "group". Listed, not imported: a call loads only the one it runs.
COMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "status": (
        "gpuclaim.cli.status",
        "status",
        {
            "help": "Show every GPU: free, claimed, busy-unclaimed, stale, unreachable.",
            "short_help": "Every GPU: free, claimed, busy-unclaimed, stale, unreachable.",
        },
    ),
    "ls": ("gpuclaim.cli.status", "status", {"hidden": True}),
    "claim": ("gpuclaim.cli.claim", "claim", {}),
    "release": ("gpuclaim.cli.claim", "release", {}),
    "extend": (
        "gpuclaim.cli.claim",
        "extend",
        {"short_help": "More time for your own claim or job, within the cluster's limit."},
    ),
    "reserve": (
        "gpuclaim.cli.reserve",
        "reserve",
        {"short_help": "Book GPUs for a future window; list or cancel bookings."},
    ),
    "run": (
        "gpuclaim.cli.jobs",
        "run",
        {
            # everything after the job's command is its own
            "context_settings": {"allow_interspersed_args": False},
            "short_help": "Run a command on claimed GPUs in tmux on a node, or queue it.",
        },
    ),
    "serve": (
        "gpuclaim.cli.serve",
        "serve",
        {
            "context_settings": {"allow_interspersed_args": False},
            "short_help": "A service that stays up: restarted, health-checked, with a port.",
        },
    ),
    "forward": (
        "gpuclaim.cli.forward",
        "forward",
        {"short_help": "A service's port on this machine, through SSH, until Ctrl-C."},
    ),
    "jobs": (
        "gpuclaim.cli.jobs",
        "jobs",
        {"short_help": "Running and queued jobs of everyone, and your recent ones."},
    ),
    "why": (
        "gpuclaim.cli.explain",
        "why",
        {"short_help": "Why a queued job waits: priority, reason, expected start."},
    ),
    "logs": ("gpuclaim.cli.jobs", "logs", {}),
    "pull": (
        "gpuclaim.cli.files",
        "pull",
        {"short_help": "Copy files a job wrote on its node back here."},
    ),
    "attach": ("gpuclaim.cli.jobs", "attach", {}),
    "kill": (
        "gpuclaim.cli.jobs",
        "kill",
        {"short_help": "Stop a job on all its nodes, or take it out of the queue."},
    ),
    "shell": (
        "gpuclaim.cli.sessions",
        "shell",
        {"short_help": "An interactive shell on a node with GPUs, time-limited."},
    ),
    "notebook": (
        "gpuclaim.cli.sessions",
        "notebook",
        {"short_help": "Jupyter on a node with GPUs, until its time limit."},
    ),
    "history": ("gpuclaim.cli.history", "history", {}),
    "metrics": (
        "gpuclaim.cli.metrics",
        "metrics",
        {"short_help": "Prometheus series: who holds what, idle-held GPUs, the queue."},
    ),
    "gc": (
        "gpuclaim.cli.admin",
        "gc",
        {"short_help": "Remove expired and abandoned claims, set damaged files aside."},
    ),
    "drain": ("gpuclaim.cli.admin", "drain", {}),
    "undrain": ("gpuclaim.cli.admin", "undrain", {}),
    "doctor": (
        "gpuclaim.cli.admin",
        "doctor",
        {"short_help": "Check every node: SSH, tmux, GPUs, storage, clock, agent."},
    ),
    "notify": ("gpuclaim.cli.settings", "notify_app", {"group": True}),
    "config": ("gpuclaim.cli.settings", "config_app", {"group": True}),
    "policy": (
        "gpuclaim.cli.policy",
        "policy_app",
        {"group": True, "short_help": "The lab's limits, queue and idle policy."},
    ),
    "init": (
        "gpuclaim.cli.setup",
        "init",
        {"short_help": "Write a config file and make the store."},
    ),
    "demo": (
        "gpuclaim.cli.setup",
        "demo",
        {"short_help": "A sandbox with simulated GPUs: try it all without a cluster."},
    ),
    "export": (
        "gpuclaim.cli.export",
        "app",
        {
            "group": True,
            "short_help": "SLURM's config and job scripts, to move on to SLURM.",
        },
    ),
    "board": (
        "gpuclaim.entry.board_command",
        "board",
        {"short_help": "Live board of who holds which GPU; claim, release, kill."},
    ),
}


@functools.cache
def build_app(only: Optional[str] = None) -> typer.Typer:
    """The typer app: the global options (common.root) and every command, or only the
    command ``only`` (what one call runs: the others' imports and typer's conversion of
    each to a click command are a third of a look's start-up)."""
    import importlib

    import typer

    from gpuclaim.cli.common import root

    app = typer.Typer(
        name="gpuclaim",
        help="Claim, check and run on a small team's shared GPU servers.",
        no_args_is_help=True,
        add_completion=False,  # common.root has --install-completion and --show-completion
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(root)
    for name, (module, attribute, how) in COMMANDS.items():
        if only is not None and name != only:
            continue
        target = getattr(importlib.import_module(module), attribute)
        options = {k: v for k, v in how.items() if k != "group"}
        if how.get("group"):
            app.add_typer(target, name=name, **options)
        else:
            app.command(name, **options)(target)
    return app


def app_for(args: list[str]) -> typer.Typer:
    """The app for one call: only the command it names, when it names one we have
    (``gpuclaim --help`` and a mistyped command get the whole app and its list)."""
    from gpuclaim.cli.completion_answer import resolve

    try:
        path = resolve(args).path
    except Exception:  # a stale or broken completion spec: the whole app still works
        path = []
    if path and path[0] in COMMANDS:
        return build_app(path[0])
    return build_app()


def __getattr__(name: str) -> Any:
    if name == "app":  # `from gpuclaim.entry.main import app` still works
        return build_app()
    raise AttributeError(name)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI; every error ends here as one line on stderr and a documented exit code."""
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C while Python still imports, before the command runs
        sys.stderr.write("gpuclaim: interrupted\n")
        return 130


def run() -> NoReturn:
    """The program (``gpuclaim``, ``python -m gpuclaim``): ``main()``, then out without
    tearing the interpreter down. Freeing every module and object costs a command ~30 ms
    after its last word, and nothing needs it: exit handlers still run, output is flushed.
    A thread still at work (none of gpuclaim's: its workers are daemons) gets the normal
    exit, which waits for it."""
    code = main()
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if any(t.is_alive() and not t.daemon for t in others):
        sys.exit(code)
    _flush_output()  # the answer reaches a pipe now, not after the exit handlers' work
    try:
        atexit._run_exitfuncs()  # e.g. the agents' installs a first call leaves behind it
    except BaseException:  # Python 3.9 raises the last handler's error again (after printing it)
        pass
    _flush_output()
    os._exit(code)


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that left, a closed stream: nothing to keep
            pass


def _main(argv: Optional[list[str]]) -> int:
    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:
        from gpuclaim.cli.completion_answer import answer

        return answer(instruction)
    from gpuclaim.core.errors import ExitCode, GpuclaimError  # after the fast path: it needs none

    args = sys.argv[1:] if argv is None else argv
    ours = args[: args.index("--")] if "--" in args else args  # not a job's own --debug
    debug = "--debug" in ours or os.environ.get("GPUCLAIM_DEBUG") == "1"
    _quiet_libraries(debug)
    _first_contacts(ours)
    _keep_dataclass_code()
    if not debug:  # no "last resort" on stderr, without importing logging (~9 % of a look)
        from gpuclaim.core.lazylog import quiet_libraries_logging

        quiet_libraries_logging()
    from gpuclaim.entry.fast import fast_command

    fast = fast_command(args)  # `status` without typer's start; None: the typer app
    try:
        if fast is not None:
            result = fast()
        else:
            result = app_for(args)(args=args, prog_name="gpuclaim", standalone_mode=False)
    except GpuclaimError as exc:
        return _fail(exc.exit_code, str(exc), debug)
    except KeyboardInterrupt:
        sys.stderr.write("gpuclaim: interrupted\n")
        return 130
    except BrokenPipeError:
        # `gpuclaim status | head`: the reader left; not an error worth a traceback.
        _stdout_to_devnull()
        return ExitCode.OK
    except SystemExit:
        # click turns a broken pipe inside a command into exit 1, after wrapping stdout so
        # that nothing more is said: the same reader that left, the same answer.
        if type(sys.stdout).__name__ == "PacifyFlushWrapper":
            _stdout_to_devnull()
            return ExitCode.OK
        raise
    except OSError as exc:
        # A path the user named that cannot be used, a full disk: their situation, not a bug.
        _flush_stdout()
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(ExitCode.ERROR, f"{where}{exc.strerror or exc}", debug)
    except Exception as exc:
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        # click's exceptions, whether from click itself or the copy newer typers vendor.
        if "NoArgsIsHelpError" in kinds:
            return _no_command(exc, debug)
        if "UsageError" in kinds:
            where = f" (see 'gpuclaim {_command_path(exc, args)}--help')"
            return _fail(ExitCode.USAGE, exc.format_message() + where, debug)  # type: ignore[attr-defined]
        if "Abort" in kinds:
            sys.stderr.write("gpuclaim: aborted\n")
            return 130
        if "ClickException" in kinds:
            return _fail(ExitCode.ERROR, exc.format_message(), debug)  # type: ignore[attr-defined]
        if debug:
            import traceback

            traceback.print_exc()
        # A bug: still one line, with the way to see more.
        sys.stderr.write(
            f"gpuclaim: internal error: {type(exc).__name__}: {exc} (run with --debug for the "
            "traceback, and please report it)\n"
        )
        return ExitCode.ERROR
    return int(result) if isinstance(result, int) else ExitCode.OK


def _quiet_libraries(debug: bool) -> None:
    """What libraries say on their own (paramiko's transport thread logs a traceback for a
    node that never sends its banner, cryptography warns about ciphers) is not for the user's
    terminal: gpuclaim reports the outcome itself, in its own line. ``--debug`` shows it all."""
    import threading

    if debug:
        import logging

        logging.basicConfig(level=logging.DEBUG, format="%(relativeCreated)d %(name)s: %(message)s")
        return
    warnings.simplefilter("ignore")
    threading.excepthook = lambda _args: None  # a library's worker thread dying: not ours


# Commands that look at nodes first thing: on the first call of the day their SSH sessions
# start before the command's own imports (remote.early). Which nodes: --node / --gpu's.
_LOOKS_AT_NODES = frozenset(
    {"status", "ls", "board", "claim", "run", "serve", "reserve", "shell", "notebook"}
)


def _first_contacts(args: list[str]) -> None:
    """Start the first call's SSH sessions to the nodes this command will look at, if it
    is one that looks and they have no warm path; never fails (the command says what is
    wrong with the config, or anything else)."""
    from gpuclaim.entry.fast import leading_globals

    leading = leading_globals(args)
    if leading is None or leading[1] >= len(args):
        return
    config, i = leading
    rest = args[i + 1 :]
    if args[i] not in _LOOKS_AT_NODES or "-h" in rest or "--help" in rest:
        return
    named = _named_nodes(rest)
    try:
        from pathlib import Path

        from gpuclaim.core.paths import config_path
        from gpuclaim.remote.early_plan import spawn_predicted

        # the sessions the last call with this config started, before the config is read
        spawn_predicted(str(Path(config) if config else config_path()), named or None)
        _keep_dataclass_code()  # before the config's dataclasses

        from gpuclaim.app.configfile import load_config

        loaded = load_config(Path(config) if config else None, hand_over=True)
        names = named or [n.name for n in loaded.nodes]
        if not any(n.transport == "ssh" and n.name in names for n in loaded.nodes):
            return  # only SSH nodes get one: spare a local cluster remote's imports (~10 ms)
        from gpuclaim.remote.early import start_first_contacts

        start_first_contacts(loaded, names)
    except Exception:  # only a head start: the command itself reports what is wrong
        pass


def _keep_dataclass_code() -> None:
    """``@dataclass``'s generated code from the last calls, not compiled again (~15 % of a
    look's CPU on Python 3.9-3.12): ``entry.dataclass_code``."""
    from gpuclaim.core.paths import data_dir
    from gpuclaim.entry.dataclass_code import install

    install(data_dir() / "cache")


def _named_nodes(args: list[str]) -> list[str]:
    """The nodes ``--node N`` and ``--gpu N:i,j`` name (empty: any node may be looked at)."""
    named: list[str] = []
    for i, arg in enumerate(args):
        for flag in ("--node", "--gpu"):
            value = None
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
            if value:
                named.append(value.split(":", 1)[0])
    return named


def _fail(code: int, message: str, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(f"gpuclaim: error: {message}\n")
    return int(code)


def _no_command(exc: Exception, debug: bool) -> int:
    """``gpuclaim`` alone prints the help; ``gpuclaim notify`` says what it needs, in one line."""
    from gpuclaim.core.errors import ExitCode

    ctx: Any = getattr(exc, "ctx", None)
    if ctx is None or ctx.parent is None:
        sys.stdout.write((ctx.get_help() if ctx is not None else "") + "\n")
        return ExitCode.USAGE
    group = ctx.command
    names = [n for n in group.list_commands(ctx) if not group.get_command(ctx, n).hidden]
    path = ctx.command_path.split(" ", 1)[-1]
    message = (
        f"'gpuclaim {path}' needs a command: {', '.join(names)} (see 'gpuclaim {path} --help')"
    )
    return _fail(ExitCode.USAGE, message, debug)


def _command_path(exc: Exception, args: list[str]) -> str:
    """'claim ' for an error in ``gpuclaim claim ...``, '' at the top level."""
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and ctx.parent is not None:
        return str(ctx.command_path).split(" ", 1)[-1] + " "
    if ctx is None:  # raised by the option parser, before the command had a context
        from gpuclaim.cli.completion_answer import resolve

        path = resolve(args).path
        return "".join(f"{p} " for p in path)
    return ""


def _stdout_to_devnull() -> None:
    """Output nobody can read any more: drop it, so that the exit flush does not fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except OSError:  # stdout itself is what failed (a full disk): drop the rest
        _stdout_to_devnull()


if __name__ == "__main__":
    run()
