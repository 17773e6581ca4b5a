"""The completion scripts for bash, zsh and fish, and installing or showing them
(``gpuclaim --install-completion``, ``--show-completion``, and ``completions/`` through
scripts/gen_completions.py). Each script calls ``gpuclaim`` once per TAB with
``_GPUCLAIM_COMPLETE`` set; ``completion_answer.py`` answers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from gpuclaim.cli.completion_answer import SHELLS

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
