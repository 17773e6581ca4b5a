"""Config files: reading one (``load_config``), and writing one (``gpuclaim init``, the demo):
TOML rendered by hand, then re-validated. Only the laptop reads TOML; nodes get JSON."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from gpuclaim.app.hostlists import expand_config_nodes
from gpuclaim.core import paths
from gpuclaim.core.config import Config, local_config, parse_config
from gpuclaim.core.errors import ConfigError


def render_config(
    *,
    cluster: str,
    nodes: Sequence[str],
    storage: str,
    user: Optional[str] = None,
    ssh_config: Optional[str] = None,
    defaults: Optional[Mapping[str, Any]] = None,
    slack_webhook: Optional[str] = None,
    node_settings: Optional[Mapping[str, Mapping[str, Any]]] = None,
    header: str = "",
) -> str:
    """A commented config; raises ConfigError if the result would not load."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()] if header else []
    lines += [
        "# gpuclaim config: see the README's config reference.",
        f"cluster = {_toml(cluster)}",
        f'nodes = {_toml(list(nodes))}  # SSH host aliases; "localhost" = this machine',
        f"storage = {_toml(storage)}  # shared directory, or ssh://HOST/PATH",
    ]
    if ssh_config:
        lines.append(f"ssh_config = {_toml(ssh_config)}")
    if user:
        lines.append(f"user = {_toml(user)}")
    lines += ["", "[defaults]"]
    for key, value in (defaults or {}).items():
        lines.append(f"{key} = {_toml(value)}")
    if not defaults:
        lines += [
            '# time = "4h"            # default claim length',
            '# max_time = "7d"        # longest claim or extension',
            "# max_gpus_per_user = 0  # 0 = no limit",
            "# busy_memory_mib = 256  # foreign use below this still counts as free",
        ]
    for name, settings in (node_settings or {}).items():
        lines += ["", f"[node.{_key(name)}]"]
        for key, value in settings.items():
            lines.append(f"{key} = {_toml(value)}")
    lines += ["", "[slack]"]
    if slack_webhook:
        lines.append(f"webhook_url = {_toml(slack_webhook)}")
    else:
        lines.append('# webhook_url = "https://hooks.slack.com/services/..."')
    text = "\n".join(lines) + "\n"
    validate_text(text)
    return text


def validate_text(text: str, path: Optional[Path] = None) -> Config:
    return parse_config(expand_config_nodes(toml_module().loads(text)), path)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_key(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _key(key: str) -> str:
    bare = key.replace("-", "").replace("_", "").isalnum() and key.isascii()
    return key if bare else json.dumps(key, ensure_ascii=False)


def toml_module() -> Any:
    """tomllib (3.11+) or tomli; imported when a file is read, so that nodes on Python 3.9
    (which get the config as JSON from the CLI) never need it."""
    if sys.version_info < (3, 11):
        import tomli

        return tomli
    import tomllib

    return tomllib


# A config read early (entry: the first call's SSH sessions) and handed to the next load of
# the same unchanged file in this process, so that a call parses it once.
_HANDED: dict[str, tuple[tuple[int, int, int], Config]] = {}


def load_config(path: Optional[Path] = None, hand_over: bool = False) -> Config:
    """The config at ``path`` (default: ``$GPUCLAIM_CONFIG`` or the user's), or local mode.
    With ``hand_over``, the next call for the same unchanged file returns the same one."""
    explicit = path is not None or bool(os.environ.get("GPUCLAIM_CONFIG"))
    cfg_path = path or paths.config_path()
    try:
        st = cfg_path.stat()
    except OSError:
        st = None
    if st is None:
        if explicit:
            raise ConfigError(
                f"config file {cfg_path} does not exist", hint="run 'gpuclaim init' to write one"
            )
        return local_config()
    key = (st.st_mtime_ns, st.st_size, st.st_ino)
    held = _HANDED.pop(str(cfg_path), None)
    if held is not None and held[0] == key:
        return held[1]
    config = _read_config(cfg_path, st.st_mode)
    if hand_over:
        _HANDED[str(cfg_path)] = (key, config)
    return config


def _read_config(cfg_path: Path, mode: int) -> Config:
    toml = toml_module()
    try:
        raw = toml.loads(cfg_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config {cfg_path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config {cfg_path}: not UTF-8 text ({exc.reason})") from exc
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"config {cfg_path}: invalid TOML: {exc}") from exc
    try:
        config = parse_config(expand_config_nodes(raw), cfg_path)
    except ConfigError as exc:
        raise ConfigError(f"config {cfg_path}: {exc.message}", hint=exc.hint) from exc
    if config.slack.webhook_url and mode & 0o044:
        warning = (
            f"{cfg_path} holds the Slack webhook (a secret) and others can read it: "
            f"chmod 600 {cfg_path}"
        )
        config = replace(config, warnings=(*config.warnings, warning))
    return config
