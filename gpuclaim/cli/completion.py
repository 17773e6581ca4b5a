"""Shell completion (bash, zsh, fish) that answers in a few milliseconds.

The scripts (``completions/``, or ``gpuclaim --install-completion``) run ``gpuclaim`` with
``_GPUCLAIM_COMPLETE`` set. ``main()`` answers that before importing typer or any command:
from the command tree in ``completion_spec.py`` (generated from the app by
``scripts/gen_completions.py``; a test fails when it is stale) and, for values, from the
config file (node names) and a small cache in the data dir that ``status``, ``jobs``,
``claim``, ``release`` and ``run`` fill with what they saw (claim ids, job names, users).
Completion never touches SSH, the store or a GPU.

This module imports only the standard library at load time; typer is imported by the
functions that build the spec and by the typer completers, which the fast path never calls.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

PROG = "gpuclaim"
COMPLETE_VAR = "_GPUCLAIM_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
CACHE_VERSION = 1
CACHE_LIMIT = 100  # values kept per kind and cluster
CACHE_CLUSTERS = 8  # configs remembered (the demo, the real cluster, a test one...)

Item = tuple[str, str, str]  # (type, value, help); type: plain, file or dir


# -- the scripts --------------------------------------------------------------------------------
# After click 8's templates (BSD-3-Clause): the shell passes the words and the cursor, the
# program prints typed items, the script turns "file"/"dir" into the shell's own path
# completion. One call of the program per TAB.

_BASH = """\
# bash completion for gpuclaim (generated: scripts/gen_completions.py).
# Load it with `source gpuclaim.bash`, or run `gpuclaim --install-completion`.
_gpuclaim_completion() {
    local IFS=$'\\n'
    local response completion
    response=$(env COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD=$COMP_CWORD \\
        _GPUCLAIM_COMPLETE=bash_complete "$1" 2>/dev/null)
    COMPREPLY=()
    for completion in $response; do
        case ${completion%%,*} in
            dir) compopt -o dirnames ;;
            file) compopt -o default ;;
            plain) COMPREPLY+=("${completion#*,}") ;;
        esac
    done
    return 0
}
complete -o nosort -F _gpuclaim_completion gpuclaim
"""

_ZSH = """\
#compdef gpuclaim
# zsh completion for gpuclaim (generated: scripts/gen_completions.py).
# Put it on $fpath as _gpuclaim, or source it after compinit; or run
# `gpuclaim --install-completion`.
_gpuclaim() {
    local -a response described plain
    local type key descr
    (( ! $+commands[gpuclaim] )) && return 1
    response=("${(@f)$(env COMP_WORDS="${words[*]}" COMP_CWORD=$((CURRENT-1)) \\
        _GPUCLAIM_COMPLETE=zsh_complete gpuclaim 2>/dev/null)}")
    for type key descr in "${response[@]}"; do
        case $type in
            plain)
                if [[ $descr == _ ]]; then plain+=("$key"); else described+=("$key:$descr"); fi ;;
            dir) _path_files -/ ;;
            file) _path_files -f ;;
        esac
    done
    (( $#described )) && _describe -V unsorted described -U
    (( $#plain )) && compadd -U -V unsorted -a plain
    return 0
}
# Autoloaded from $fpath, this file's body runs once and has just replaced the function
# _gpuclaim by the one above: complete now. Sourced, register it for gpuclaim.
if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
    _gpuclaim "$@"
else
    compdef _gpuclaim gpuclaim
fi
"""

_FISH = """\
# fish completion for gpuclaim (generated: scripts/gen_completions.py).
# Put it in ~/.config/fish/completions/, or run `gpuclaim --install-completion`.
function __gpuclaim_complete
    set -l response (env COMP_WORDS=(commandline -cp) _GPUCLAIM_COMPLETE=fish_complete \\
        gpuclaim 2>/dev/null)
    for completion in $response
        set -l item (string split -m 1 "," -- $completion)
        switch $item[1]
            case dir
                __fish_complete_directories (commandline -ct)
            case file
                __fish_complete_path (commandline -ct)
            case plain
                printf '%s\\n' $item[2]
        end
    end
end
complete --command gpuclaim --no-files --arguments "(__gpuclaim_complete)"
"""

_SCRIPTS = {"bash": _BASH, "zsh": _ZSH, "fish": _FISH}
SCRIPT_NAMES = {"bash": "gpuclaim.bash", "zsh": "_gpuclaim", "fish": "gpuclaim.fish"}


def script(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    try:
        return _SCRIPTS[shell]
    except KeyError:
        from gpuclaim.core.errors import UsageError

        raise UsageError(
            f"no completion for the shell {shell!r}", hint=f"gpuclaim has {', '.join(SHELLS)}"
        ) from None


def detect_shell() -> str:
    """The shell gpuclaim runs under (its parent process), else ``$SHELL``."""
    name = ""
    try:
        import shellingham  # type: ignore[import-untyped]  # typer's dependency; optional here

        name = str(shellingham.detect_shell()[0])
    except Exception:  # ImportError, or shellingham cannot tell (no /proc, odd parent)
        name = Path(os.environ.get("SHELL", "")).name
    if name not in SHELLS:
        from gpuclaim.core.errors import UsageError

        raise UsageError(
            f"cannot install completion for the shell {name or '(unknown)'!r}",
            hint=f"gpuclaim has {', '.join(SHELLS)}; run this from one of them",
        )
    return name


def install(shell: str, home: Optional[Path] = None) -> tuple[Path, str]:
    """Write the script where ``shell`` finds it; returns the path and how it gets loaded.
    The places are typer's, so that ``--install-completion`` behaves as in other typer CLIs."""
    home = home or Path.home()
    text = script(shell)
    if shell == "bash":
        target = home / ".bash_completions" / "gpuclaim.sh"
        _append_once(home / ".bashrc", f"source '{target}'")
        how = "sourced from ~/.bashrc"
    elif shell == "zsh":
        target = home / ".zfunc" / "_gpuclaim"
        _append_once(home / ".zshrc", "fpath+=~/.zfunc; autoload -Uz compinit; compinit")
        how = "on $fpath through ~/.zshrc"
    else:
        target = home / ".config" / "fish" / "completions" / "gpuclaim.fish"
        how = "loaded by fish when needed"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target, how


def _append_once(rc: Path, line: str) -> None:
    text = rc.read_text(encoding="utf-8") if rc.exists() else ""
    if line not in text.splitlines():
        rc.write_text(text + ("" if not text or text.endswith("\n") else "\n") + line + "\n")


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


# -- where the values come from: the config and the cache ---------------------------------------


def config_file(explicit: Optional[str] = None) -> Optional[Path]:
    """The config file a command would load (``--config``, ``$GPUCLAIM_CONFIG``, the user's);
    None when there is none (local mode)."""
    from gpuclaim.core import paths

    path = Path(explicit).expanduser() if explicit else paths.config_path()
    return path if path.is_file() else None


def cache_key(config_path: Optional[Path]) -> str:
    """One cache section per config: the demo's jobs are not the lab's."""
    if config_path is None:
        return "local"
    try:
        return str(config_path.expanduser().resolve())
    except OSError:
        return str(config_path)


def node_values(config: Optional[str]) -> list[tuple[str, str]]:
    """Node names straight from the config file (no SSH), described by the last status."""
    path = config_file(config)
    if path is None and (config or os.environ.get("GPUCLAIM_CONFIG")):
        return []  # a config named but missing: the command itself will say so
    section = _section(path)
    names = ["localhost"] if path is None else _config_nodes(path, section)
    seen = dict(_pairs(section, "nodes"))
    return [(n, seen.get(n, "")) for n in names if n]


def _config_nodes(path: Path, section: Mapping[str, Any]) -> list[str]:
    """The config's ``nodes``; kept in the cache with the file's size and mtime, because
    importing a TOML parser costs more than all the rest of a completion."""
    st = path.stat()
    stamp = [(f"{st.st_mtime_ns}:{st.st_size}", "")]
    if _pairs(section, "config_stamp") == stamp:
        return [name for name, _ in _pairs(section, "config_nodes")]
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib

    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    listed = raw.get("nodes", ["localhost"])
    names = [n.strip() for n in listed if isinstance(n, str)] if isinstance(listed, list) else []
    remember(path, replace={"config_stamp": stamp, "config_nodes": [(n, "") for n in names if n]})
    return names


def _cached_values(kind: str) -> Callable[[Optional[str]], list[tuple[str, str]]]:
    def values(config: Optional[str]) -> list[tuple[str, str]]:
        return _pairs(_section(config_file(config)), kind)

    values.__name__ = f"{kind}_values"
    return values


def grouping_values(config: Optional[str]) -> list[tuple[str, str]]:
    return [("user", ""), ("node", ""), ("day", "")]  # history --by (history.GROUPINGS)


SOURCES: dict[str, Callable[[Optional[str]], list[tuple[str, str]]]] = {
    "nodes": node_values,
    "jobs": _cached_values("jobs"),
    "claims": _cached_values("claims"),
    "users": _cached_values("users"),
    "groupings": grouping_values,
}


def cache_path() -> Path:
    from gpuclaim.core import paths

    return paths.data_dir() / "completion-cache.json"


def _read_cache() -> dict[str, Any]:
    import json

    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    clusters = data.get("clusters")
    return clusters if isinstance(clusters, dict) else {}


def _section(config_path: Optional[Path]) -> dict[str, Any]:
    section = _read_cache().get(cache_key(config_path), {})
    return section if isinstance(section, dict) else {}


def _pairs(section: Mapping[str, Any], kind: str) -> list[tuple[str, str]]:
    pairs = section.get(kind, [])
    return [
        (p[0], str(p[1]))
        for p in (pairs if isinstance(pairs, list) else [])
        if isinstance(p, list) and len(p) == 2 and isinstance(p[0], str)
    ]


def remember(
    config_path: Optional[Path],
    *,
    replace: Optional[Mapping[str, Iterable[tuple[str, str]]]] = None,
    add: Optional[Mapping[str, Iterable[tuple[str, str]]]] = None,
    remove: Optional[Mapping[str, Iterable[str]]] = None,
) -> None:
    """Note values a command has just seen, for completion: ``replace`` a kind with all there
    is, ``add`` new ones (first), ``remove`` gone ones. Never fails the command: a cache that
    cannot be written only makes completion offer less."""
    import json

    try:
        clusters = _read_cache()
        key = cache_key(config_path)
        section = clusters.pop(key, None)
        if not isinstance(section, dict):
            section = {}
        for kind, pairs in (replace or {}).items():
            section[kind] = _unique(list(pairs))
        for kind, pairs in (add or {}).items():
            section[kind] = _unique(list(pairs) + _pairs(section, kind))
        for kind, values in (remove or {}).items():
            gone = set(values)
            section[kind] = [[v, h] for v, h in _pairs(section, kind) if v not in gone]
        clusters[key] = section  # the most recent last: the oldest config goes first
        while len(clusters) > CACHE_CLUSTERS:
            clusters.pop(next(iter(clusters)))
        path = cache_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"version": CACHE_VERSION, "clusters": clusters}), "utf-8")
        tmp.replace(path)  # readers see the old file or the new one, never half of one
    except OSError:
        pass


def _unique(pairs: list[tuple[str, str]]) -> list[list[str]]:
    seen: set[str] = set()
    kept = []
    for value, help_ in pairs:
        if value not in seen:
            seen.add(value)
            kept.append([value, help_])
    return kept[:CACHE_LIMIT]


def claim_item(claim: Any) -> tuple[str, str]:
    """A claim as completion shows it: its id, described by holder, GPUs and note."""
    gpus = ",".join(map(str, claim.indices))
    what = claim.note or (f"job {claim.job}" if claim.job else "")
    return claim.id, " · ".join(x for x in (claim.user, f"{claim.node} GPU {gpus}", what) if x)


def job_item(job: Mapping[str, Any]) -> tuple[str, str]:
    """A job (its ``to_dict()``) as completion shows it."""
    where = f" on {job['node']}" if job.get("node") else ""
    return str(job["name"]), f"{job.get('user', '')} · {job.get('state', '')}{where}"


def remember_view(config_path: Optional[Path], view: Any) -> None:
    """After ``status`` of every node: the claims held now, their holders, the nodes."""
    claims = {r.claim.id: r.claim for r in view.rows if r.claim is not None}
    nodes: dict[str, list[str]] = {}
    for r in view.rows:
        if r.index is not None:
            nodes.setdefault(r.node, []).append(r.state)
    described = [
        (name, f"{states.count('free')}/{len(states)} GPUs free") for name, states in nodes.items()
    ]
    described += [(name, "unreachable") for name in view.unreachable if name not in nodes]
    remember(
        config_path,
        replace={"claims": [claim_item(c) for c in claims.values()], "nodes": described},
        add={"users": [(c.user, "") for c in claims.values()]},
    )


# -- the command tree ---------------------------------------------------------------------------


def load_spec() -> dict[str, Any]:
    """The command tree as generated into ``completion_spec.py``."""
    from gpuclaim.cli.completion_spec import SPEC

    return SPEC


def _typer_completer(kind: str) -> Callable[..., list[tuple[str, str]]]:
    """An ``autocompletion=`` callback for typer: marks the parameter's kind for the spec, and
    answers with the same values when click itself drives completion."""

    def completer(ctx: Any, incomplete: str) -> list[tuple[str, str]]:
        root = ctx.find_root() if ctx is not None else None
        config = root.params.get("config") if root is not None else None
        return [
            (v, h)
            for v, h in SOURCES[kind](str(config) if config else None)
            if v.startswith(incomplete)
        ]

    completer.__name__ = f"complete_{kind}"
    COMPLETER_KINDS[completer] = kind
    return completer


COMPLETER_KINDS: dict[Callable[..., Any], str] = {}
complete_nodes = _typer_completer("nodes")
complete_jobs = _typer_completer("jobs")
complete_claims = _typer_completer("claims")
complete_users = _typer_completer("users")
complete_groupings = _typer_completer("groupings")


def build_spec(app: Any) -> dict[str, Any]:
    """The command tree of the typer ``app``: commands, options, arguments and the kind of
    value each takes. Imports typer; used by scripts/gen_completions.py and the tests."""
    import typer

    group = typer.main.get_command(app)
    ctx = group.make_context(PROG, [], resilient_parsing=True)
    return _command_spec(group, ctx)


def _command_spec(cmd: Any, ctx: Any) -> dict[str, Any]:
    import inspect

    declared: dict[str, Any] = {}
    callback = getattr(cmd.callback, "__wrapped__", None)
    if callback is not None:
        for name, p in inspect.signature(callback).parameters.items():
            declared[name] = getattr(p.default, "autocompletion", None)
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
