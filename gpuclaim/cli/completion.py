"""Shell completion (bash, zsh, fish) that answers in a few milliseconds.

The scripts (``completions/``, or ``gpuclaim --install-completion``) run ``gpuclaim`` with
``_GPUCLAIM_COMPLETE`` set. ``main()`` answers that before importing typer or any command:
from the command tree in ``completion_spec.py`` (generated from the app by
``scripts/gen_completions.py``; a test fails when it is stale) and, for values, from the
config file (node names) and a small cache in the data dir that ``status``, ``jobs``,
``claim``, ``release`` and ``run`` fill with what they saw (claim ids, job names, users).
Completion never touches SSH, the store or a GPU.

The work is split by concern; this module gathers the names the commands, the tests and
scripts/gen_completions.py use:

- ``completion_answer``: the fast path ``main()`` imports directly (``answer``, ``resolve``);
- ``completion_values``: node names, the cache and ``remember``, the typer completers;
- ``completion_scripts``: the shell scripts, installing and showing them;
- ``completion_build``: the spec built from the typer app, and ``completion_spec.py``'s source.

All of them import only the standard library at load time; typer is imported by the
functions that build the spec and by the typer completers, which the fast path never calls.
"""

from __future__ import annotations

from gpuclaim.cli.completion_answer import (
    COMPLETE_VAR,
    PROG,
    SHELLS,
    Item,
    Where,
    answer,
    complete,
    load_spec,
    resolve,
    split_words,
    value_items,
)
from gpuclaim.cli.completion_build import build_spec, render_spec_module
from gpuclaim.cli.completion_scripts import SCRIPT_NAMES, detect_shell, install, script
from gpuclaim.cli.completion_values import (
    CACHE_CLUSTERS,
    CACHE_LIMIT,
    CACHE_VERSION,
    COMPLETER_KINDS,
    SOURCES,
    booking_item,
    cache_key,
    cache_path,
    claim_item,
    complete_claims,
    complete_groupings,
    complete_jobs,
    complete_nodes,
    complete_reservations,
    complete_signals,
    complete_users,
    config_file,
    grouping_values,
    job_item,
    node_values,
    remember,
    remember_view,
)

__all__ = [
    "CACHE_CLUSTERS",
    "CACHE_LIMIT",
    "CACHE_VERSION",
    "COMPLETER_KINDS",
    "COMPLETE_VAR",
    "PROG",
    "SCRIPT_NAMES",
    "SHELLS",
    "SOURCES",
    "Item",
    "Where",
    "answer",
    "booking_item",
    "build_spec",
    "cache_key",
    "cache_path",
    "claim_item",
    "complete",
    "complete_claims",
    "complete_groupings",
    "complete_jobs",
    "complete_nodes",
    "complete_reservations",
    "complete_signals",
    "complete_users",
    "config_file",
    "detect_shell",
    "grouping_values",
    "install",
    "job_item",
    "load_spec",
    "node_values",
    "remember",
    "remember_view",
    "render_spec_module",
    "resolve",
    "script",
    "split_words",
    "value_items",
]
