"""The ``gpuclaim`` app: global options, command registration, and the one place where errors
become a one-line message and an exit code."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import typer

from gpuclaim import __version__
from gpuclaim.cli import admin, board, claim, history, jobs, settings, setup, status
from gpuclaim.cli.common import AppState
from gpuclaim.errors import ExitCode, GpuclaimError

app = typer.Typer(
    name="gpuclaim",
    help="Claim, check and run on a small team's shared GPU servers.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpuclaim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(
        None, "--config", envvar="GPUCLAIM_CONFIG", help="Config file to use.", show_envvar=True
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Claim, check and run on a small team's shared GPU servers."""
    ctx.obj = AppState(config_path=config)
    ctx.call_on_close(ctx.obj.finish)


app.command("status", help="Show every GPU: free, claimed, busy-unclaimed, stale, unreachable.")(
    status.status
)
app.command("ls", hidden=True)(status.status)
app.command("claim")(claim.claim)
app.command("release")(claim.release)
app.command("extend")(claim.extend)
app.command("run", context_settings=jobs.RUN_CONTEXT)(jobs.run)
app.command("jobs")(jobs.jobs)
app.command("logs")(jobs.logs)
app.command("attach")(jobs.attach)
app.command("kill")(jobs.kill)
app.command("shell")(jobs.shell)
app.command("notebook")(jobs.notebook)
app.command("history")(history.history)
app.command("gc")(admin.gc)
app.command("drain")(admin.drain)
app.command("undrain")(admin.undrain)
app.command("doctor")(admin.doctor)
app.add_typer(settings.notify_app, name="notify")
app.add_typer(settings.config_app, name="config")
app.command("init")(setup.init)
app.command("demo")(setup.demo)
app.command("board")(board.board)


def main(argv: Optional[list[str]] = None) -> int:
    """Run the CLI; every error ends here as one line on stderr and a documented exit code."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("GPUCLAIM_DEBUG") == "1"
    try:
        result = app(args=args, prog_name="gpuclaim", standalone_mode=False)
    except GpuclaimError as exc:
        return _fail(exc.exit_code, str(exc), debug)
    except KeyboardInterrupt:
        sys.stderr.write("gpuclaim: interrupted\n")
        return 130
    except BrokenPipeError:
        # `gpuclaim status | head`: the reader left; not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except Exception as exc:
        kinds = {cls.__name__ for cls in type(exc).__mro__}
        # click's exceptions, whether from click itself or the copy newer typers vendor.
        if "NoArgsIsHelpError" in kinds:
            ctx = getattr(exc, "ctx", None)
            sys.stdout.write((ctx.get_help() if ctx is not None else "") + "\n")
            return ExitCode.USAGE
        if "UsageError" in kinds:
            where = f" (see 'gpuclaim {_command_path(exc)}--help')"
            return _fail(ExitCode.USAGE, exc.format_message() + where, debug)  # type: ignore[attr-defined]
        if "Abort" in kinds:
            sys.stderr.write("gpuclaim: aborted\n")
            return 130
        if "ClickException" in kinds:
            return _fail(ExitCode.ERROR, exc.format_message(), debug)  # type: ignore[attr-defined]
        if debug:
            traceback.print_exc()
        # A bug: still one line, with the way to see more.
        sys.stderr.write(
            f"gpuclaim: internal error: {type(exc).__name__}: {exc} (run with --debug for the "
            "traceback, and please report it)\n"
        )
        return ExitCode.ERROR
    return int(result) if isinstance(result, int) else ExitCode.OK


def _fail(code: int, message: str, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    sys.stderr.write(f"gpuclaim: error: {message}\n")
    return int(code)


def _command_path(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    if ctx is None or ctx.parent is None:
        return ""
    return str(ctx.command_path).split(" ", 1)[-1] + " "


if __name__ == "__main__":
    raise SystemExit(main())
