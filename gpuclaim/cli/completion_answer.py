"""The fast path of shell completion: what ``main()`` runs when ``_GPUCLAIM_COMPLETE`` is set.

It reads the shell's words, walks them through the command tree in ``completion_spec.py``
the way click would parse them, and prints what may come next, typed for the script
(``completion_scripts.py``). Values come from ``completion_values.py``. Start-up critical:
this module and what it imports load the standard library only, never typer or rich.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from gpuclaim.cli.completion_values import SOURCES

PROG = "gpuclaim"
COMPLETE_VAR = "_GPUCLAIM_COMPLETE"
SHELLS = ("bash", "zsh", "fish")

Item = tuple[str, str, str]  # (type, value, help); type: plain, file or dir


# -- answering the shell ------------------------------------------------------------------------


def answer(instruction: str, env: Mapping[str, str] = os.environ) -> int:
    """Print the completions the shell asked for in ``env``; the fast path of ``main()``."""
    shell = instruction.partition("_")[0]
    if shell not in SHELLS:
        sys.stderr.write(f"gpuclaim: no completion for {instruction!r}\n")
        return 1
    args, incomplete = _words(shell, env)
    try:
        items = complete(args, incomplete)
    except Exception:  # a broken config or cache must never spill onto the command line
        if env.get("GPUCLAIM_DEBUG") == "1":
            raise
        items = []
    sys.stdout.write("".join(_format(shell, item) for item in items))
    return 0


def _words(shell: str, env: Mapping[str, str]) -> tuple[list[str], str]:
    line = env.get("COMP_WORDS", "")
    words = split_words(line)
    if shell == "fish":  # the line up to the cursor: the last word is incomplete unless a space
        args = words[1:]
        incomplete = args.pop() if args and not line[-1:].isspace() else ""
        return args, incomplete
    try:
        cword = int(env.get("COMP_CWORD", ""))
    except ValueError:
        cword = len(words)
    return words[1:cword], (words[cword] if cword < len(words) else "")


def split_words(line: str) -> list[str]:
    """Shell words as the shell means them; an unclosed quote still gives its partial word."""
    import shlex

    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split = True
    lex.commenters = ""
    words: list[str] = []
    try:
        words.extend(lex)
    except ValueError:
        words.append(lex.token)
    return words


def _format(shell: str, item: Item) -> str:
    kind, value, help_ = item
    help_ = " ".join(help_.split())
    if shell == "bash":
        return f"{kind},{value}\n"
    if shell == "zsh":
        return f"{kind}\n{value.replace(':', chr(92) + ':')}\n{help_ or '_'}\n"
    return f"{kind},{value}\t{help_}\n" if help_ else f"{kind},{value}\n"


def complete(
    args: Sequence[str], incomplete: str, spec: Optional[dict[str, Any]] = None
) -> list[Item]:
    """What may come next after ``args`` (the words before the cursor), given ``incomplete``."""
    where = resolve(args, spec)
    cmd, expecting = where.command, where.expecting
    if expecting is not None:
        if incomplete == "=":  # bash splits --node=x into "--node" "=" "x"
            return [(k, "=" + v, h) for k, v, h in value_items(expecting, "", where.config)]
        return value_items(expecting, incomplete, where.config)
    if where.only_args:
        return [("file", incomplete, "")]  # `run -- python tra<TAB>`: the shell's own
    if incomplete.startswith("-"):
        name, eq, value = incomplete.partition("=")
        if eq:
            opt = _find_option(cmd, name)
            if opt is None or opt["value"] is None:
                return []
            return [(k, f"{name}={v}", h) for k, v, h in value_items(opt, value, where.config)]
        return [
            ("plain", name, opt["help"])
            for opt in cmd["options"]
            if opt["multiple"] or not (set(opt["names"]) & where.used)
            for name in opt["names"]
            if name.startswith(incomplete)
        ]
    if cmd["commands"]:
        return [
            ("plain", name, sub["help"])
            for name, sub in cmd["commands"].items()
            if name.startswith(incomplete) and not sub["hidden"]
        ]
    params = cmd["args"]
    if not params:
        return []
    param = params[min(where.positional, len(params) - 1)]
    if where.positional >= len(params) and param["nargs"] != -1:
        return []
    return value_items(param, incomplete, where.config)


class Where:
    """How far the words before the cursor got: the command, what it still expects."""

    def __init__(self, command: dict[str, Any]) -> None:
        self.command = command
        self.path: list[str] = []
        self.expecting: Optional[dict[str, Any]] = None  # an option waiting for its value
        self.used: set[str] = set()  # options given (click offers each once unless repeatable)
        self.positional = 0
        self.only_args = False  # after `--`, or a command's own arguments (run)
        self.config: Optional[str] = None  # the global --config, for the node names


def resolve(args: Sequence[str], spec: Optional[dict[str, Any]] = None) -> Where:
    """Walk ``args`` through the command tree the way click parses them."""
    where = Where(spec if spec is not None else load_spec())
    for word in args:
        if where.expecting is not None:
            if word == "=":
                continue
            if "--config" in where.expecting["names"] and not where.path:
                where.config = word
            where.expecting = None
            continue
        if where.only_args:
            where.positional += 1
            continue
        if word == "--":
            where.only_args = True
            continue
        if word.startswith("-") and word != "-":
            _take_option(where, word)
            continue
        sub = (where.command["commands"] or {}).get(word)
        if sub is not None:
            where.command, where.positional, where.used = sub, 0, set()
            where.path.append(word)
            continue
        where.positional += 1
        if not where.command["interspersed"]:
            where.only_args = True
    return where


def _take_option(where: Where, word: str) -> None:
    name, eq, value = word.partition("=")
    opt = _find_option(where.command, name)
    if opt is not None:
        where.used.update(opt["names"])
        if eq and "--config" in opt["names"] and not where.path:
            where.config = value
        elif opt["value"] is not None and not eq:
            where.expecting = opt
        return
    if word.startswith("--") or len(word) < 3:
        return  # unknown: click will say so when the command runs
    for i, ch in enumerate(word[1:], start=1):  # -fn 10, -n2: a cluster of short options
        opt = _find_option(where.command, "-" + ch)
        if opt is None:
            return
        where.used.update(opt["names"])
        if opt["value"] is not None:
            if i == len(word) - 1:
                where.expecting = opt
            return


def _find_option(cmd: dict[str, Any], name: str) -> Optional[dict[str, Any]]:
    options: list[dict[str, Any]] = cmd["options"]
    return next((opt for opt in options if name in opt["names"]), None)


def value_items(param: dict[str, Any], incomplete: str, config: Optional[str]) -> list[Item]:
    """Values for an option or argument: a path, a fixed choice, or names gpuclaim knows."""
    kind = param["value"]
    if kind in ("file", "dir"):
        return [(kind, incomplete, "")]
    if kind == "choice":
        pairs: Iterable[tuple[str, str]] = ((c, "") for c in param["choices"])
    elif kind in SOURCES:
        pairs = SOURCES[kind](config)
    else:
        return []  # free text (a note, a duration): nothing to offer
    return [("plain", v, h) for v, h in pairs if v.startswith(incomplete)]


def load_spec() -> dict[str, Any]:
    """The command tree as generated into ``completion_spec.py``."""
    from gpuclaim.cli.completion_spec import SPEC

    return SPEC
