"""The command tree for completion, built from the typer app, and the source of the
generated ``completion_spec.py`` (written by scripts/gen_completions.py; a test fails when it
is stale). Imports typer when called: never on the fast path.
"""

from __future__ import annotations

from typing import Any

from gpuclaim.cli.completion_answer import PROG
from gpuclaim.cli.completion_values import COMPLETER_KINDS


def build_spec(app: Any) -> dict[str, Any]:
    """The command tree of the typer ``app``: commands, options, arguments and the kind of
    value each takes. Imports typer; used by scripts/gen_completions.py and the tests."""
    import typer

    group = typer.main.get_command(app)
    ctx = group.make_context(PROG, [], resilient_parsing=True)
    return _command_spec(group, ctx)


def _command_spec(cmd: Any, ctx: Any) -> dict[str, Any]:
    import inspect
    import typing

    declared: dict[str, Any] = {}
    callback = getattr(cmd.callback, "__wrapped__", None)
    if callback is not None:
        hints = typing.get_type_hints(callback, include_extras=True)
        for name, p in inspect.signature(callback).parameters.items():
            # typer's two spellings: ``x: T = Option(...)`` or ``x: Annotated[T, Option(...)]``
            infos = [p.default, *getattr(hints.get(name), "__metadata__", ())]
            found = (getattr(info, "autocompletion", None) for info in infos)
            declared[name] = next((c for c in found if c is not None), None)
    options, args = [], []
    for param in cmd.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        kind = _value_kind(param, declared.get(param.name or ""))
        if param.param_type_name == "argument":
            args.append(
                {"name": param.name, "nargs": param.nargs, "value": kind, **_choices(param)}
            )
            continue
        takes_value = not (param.is_flag or param.count)
        options.append(
            {
                # short names first: click keeps the help option's names in a set
                "names": sorted(param.opts, key=_long_last)
                + sorted(param.secondary_opts, key=_long_last),
                "value": kind if takes_value else None,
                "multiple": bool(param.multiple or param.count),
                "help": _first_line(param.help or ""),
                **(_choices(param) if takes_value else {}),
            }
        )
    commands = None
    if hasattr(cmd, "commands"):
        commands = {}
        for name in cmd.list_commands(ctx):
            sub = cmd.commands[name]
            sub_ctx = sub.make_context(name, [], parent=ctx, resilient_parsing=True)
            commands[name] = _command_spec(sub, sub_ctx)
    return {
        "help": cmd.get_short_help_str(limit=80),
        "hidden": bool(cmd.hidden),
        "interspersed": bool(ctx.allow_interspersed_args),
        "options": options,
        "args": args,
        "commands": commands,
    }


def _long_last(name: str) -> tuple[bool, str]:
    return name.startswith("--"), name


def _value_kind(param: Any, completer: Any) -> str:
    if completer is not None:
        return COMPLETER_KINDS.get(completer, "")
    names = {cls.__name__ for cls in type(param.type).__mro__}
    if "Choice" in names:
        return "choice"
    if names & {"Path", "TyperPath"}:  # click's, or the one typer 0.28 has of its own
        only_dirs = getattr(param.type, "dir_okay", True) and not getattr(
            param.type, "file_okay", True
        )
        return "dir" if only_dirs else "file"
    return ""


def _choices(param: Any) -> dict[str, Any]:
    if type(param.type).__name__ == "Choice":
        return {"choices": [str(c) for c in param.type.choices]}
    return {}


def _first_line(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def render_spec_module(spec: dict[str, Any]) -> str:
    """The source of ``completion_spec.py`` for ``spec``: a plain literal, so that loading it
    costs nothing but the module's bytecode."""
    import pprint

    body = pprint.pformat(spec, width=100, sort_dicts=False)
    return (
        '"""The command tree for shell completion, generated from the app by\n'
        'scripts/gen_completions.py: do not edit (a test fails when it is stale)."""\n\n'
        "from __future__ import annotations\n\n"
        "from typing import Any\n\n"
        "# fmt: off\n"
        f"SPEC: dict[str, Any] = {body}\n"
        "# fmt: on\n"
    )
