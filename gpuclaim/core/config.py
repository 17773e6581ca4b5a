"""The config: cluster, nodes, storage, limits, identity, Slack. Validated here, once, from the
parsed TOML (reading the file is ``gpuclaim.app.configfile``: nodes get the config as JSON)."""

from __future__ import annotations

import math
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Optional, get_args
from urllib.parse import urlsplit

from gpuclaim.core import paths
from gpuclaim.core.durations import duration_setting, parse_bytes
from gpuclaim.core.errors import ConfigError, GpuclaimError
from gpuclaim.core.identity import validate_name
from gpuclaim.core.share_policy import SharePolicy, parse_share_policy
from gpuclaim.core.typos import closest

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
# How a node is reached: "local" runs on this machine in-process, "ssh" through the agent.
Transport = Literal["local", "ssh"]
TRANSPORTS: tuple[Transport, ...] = get_args(Transport)
DEFAULT_IGNORED_PROCESSES = (
    "Xorg",
    "X",
    "Xwayland",
    "gnome-shell",
    "kwin_wayland",
    "kwin_x11",
    "sddm-greeter",
    "gdm-x-session",
)
_TOP_KEYS = {
    *("cluster", "nodes", "storage", "ssh_config", "user", "agent_command", "ssh_client"),
    *("defaults", "node", "slack", "idle", "run", "queue", "share"),
}
_DEFAULT_KEYS = {
    "time",
    "max_time",
    "max_gpus_per_user",
    "busy_memory_mib",
    "ignore_processes",
    "probe_timeout",
    "connect_timeout",
    "deadline",
    "kill_grace",
    "heartbeat",
    "warm_agent",
    "agent_idle",
    "gpu_read_max_age",
    "reserve_grace",
    "max_reservation",
    "reserve_ahead",
    "max_reserved_gpu_hours",
    "keep_reservations",
    "max_queued_per_user",
    "max_service_time",
}
_WORKENV_KEYS = {"login_shell", "venv", "conda"}  # [run], and per node in [node.X]
DEFAULT_KEEP_COPIES_S = 7 * 86400.0
_NODE_KEYS = {"host", "transport", "nvidia_smi", "env", *_WORKENV_KEYS}
_IDLE_KEYS = {"window", "threshold_pct", "warn", "release_after", "release_jobs"}
_QUEUE_KEYS = {"half_life", "max_age", "fairshare_weight", "age_weight", "preempt_grace"}
MAX_PREEMPT_GRACE_S = 3600.0  # a claimer waits this long at most for preemptible jobs
_SLACK_KEYS = {"webhook_url", "events", "mentions", "opt_out", "timeout"}


@dataclass(frozen=True)
class WorkEnv:
    """How a job's command starts on a node: in the user's login environment (their
    ``$SHELL -l``'s variables, PATH first), and in a Python venv or a conda env. ``None``:
    not said here (the next level down decides: ``run`` flags, then the node, then
    ``[run]``)."""

    login_shell: Optional[bool] = None
    venv: Optional[str] = None
    conda: Optional[str] = None


@dataclass(frozen=True)
class NodeConfig:
    """One node: how to reach it (``local`` or ``ssh``) and how to ask it about its GPUs."""

    name: str
    host: str
    transport: Transport = "ssh"  # "local" runs on this machine without SSH
    nvidia_smi: tuple[str, ...] = ()  # argv to use instead of NVML / plain nvidia-smi
    env: tuple[tuple[str, str], ...] = ()
    workenv: WorkEnv = field(default_factory=WorkEnv)  # this node's own [run] settings

    def is_this_machine(self) -> bool:
        """Local, or an SSH alias that names the machine this runs on (node01 typing
        'gpuclaim claim --short' on node01)."""
        if self.transport == "local" or self.host in LOCAL_NAMES:
            return True
        import socket

        names = {socket.gethostname(), socket.gethostname().split(".")[0]}  # no DNS: fast
        return self.name in names or self.host in names


@dataclass(frozen=True)
class Limits:
    default_time_s: float = 4 * 3600
    max_time_s: float = 7 * 86400
    max_service_time_s: float = 30 * 86400  # gpuclaim serve without --time runs this long
    max_gpus_per_user: int = 0  # 0 = no limit
    busy_memory_mib: int = 256  # a GPU with less foreign memory than this still counts as free
    ignore_processes: tuple[str, ...] = DEFAULT_IGNORED_PROCESSES
    probe_timeout_s: float = 10.0  # nvidia-smi can hang
    connect_timeout_s: float = 5.0  # SSH connect, banner and auth, each
    deadline_s: float = 20.0  # a whole cluster fan-out
    kill_grace_s: float = 30.0  # SIGTERM, then this long, then SIGKILL
    heartbeat_s: float = 10.0  # job wrappers' sign of life; lost after 3 missed + 2 s
    warm_agent: bool = True  # looks go to a node agent that stays up (openssh only)
    agent_idle_s: float = 600.0  # ... and exits after this long without a request
    gpu_read_max_age_s: float = 1.0  # ... and may answer a look from a GPU read this recent
    reserve_grace_s: float = 30 * 60  # a booking nobody uses this long after it opens is freed
    max_reservation_s: float = 7 * 86400  # the longest booking
    reserve_ahead_s: float = 90 * 86400  # how far ahead a booking may start
    max_reserved_gpu_hours: float = 0.0  # per user, booked and not yet over; 0 = no limit
    keep_reservations_s: float = 90 * 86400  # gc drops an ended booking this long after its end
    max_queued_per_user: int = 0  # queued jobs (an array's tasks each) a user may have; 0 = any


@dataclass(frozen=True)
class IdlePolicy:
    window_s: float = 30 * 60  # under the threshold this long: idle
    threshold_pct: float = 5.0
    warn: bool = True  # tell the holder (Slack mention), once per idle spell
    release_after_s: Optional[float] = None  # None: never release; else after window + this
    release_jobs: bool = False  # also a running job's claim (stopping the job)


@dataclass(frozen=True)
class QueuePolicy:
    """[queue]: which queued job goes next (the README's formula): recent use, decayed with
    ``half_life``, lowers a user's jobs; waiting raises them, fully after ``max_age``."""

    half_life_s: float = 7 * 86400
    max_age_s: float = 86400
    fairshare_weight: float = 1000.0
    age_weight: float = 1000.0
    # A preemptible job gets its signal, then this long to save its state and yield, then TERM
    preempt_grace_s: float = 60.0


@dataclass(frozen=True)
class SlackConfig:
    webhook_url: str = ""
    events: tuple[str, ...] = ()
    mentions: tuple[tuple[str, str], ...] = ()
    opt_out: tuple[str, ...] = ()
    timeout_s: float = 3.0


SSH_CLIENTS = ("auto", "openssh", "fabric")


@dataclass(frozen=True)
class Config:
    path: Optional[Path]  # None: no config file, this machine is the single node
    cluster: str
    nodes: tuple[NodeConfig, ...]
    storage: str
    ssh_config: Optional[str] = None
    user: Optional[str] = None
    agent_command: Optional[str] = None  # an installed agent instead of the one we send
    # "auto": the ssh binary (ControlMaster, warm agents) where there is one, else fabric
    ssh_client: str = "auto"
    limits: Limits = field(default_factory=Limits)
    slack: SlackConfig = field(default_factory=SlackConfig)
    idle: IdlePolicy = field(default_factory=IdlePolicy)
    queue: QueuePolicy = field(default_factory=QueuePolicy)
    share: SharePolicy = field(default_factory=SharePolicy)  # [share]: shares of one GPU
    run: WorkEnv = field(default_factory=WorkEnv)  # [run]: every job's defaults
    keep_copies_s: float = 7 * 86400  # [run] keep_copies: a --sync copy after its job ended
    sync_max_bytes: int = 1 << 30  # [run] sync_max: a bigger --sync is refused
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # as parsed: sent to nodes
    warnings: tuple[str, ...] = ()
    storage_default: bool = False  # no 'storage' key: this machine's own store, made on use

    def seen_from(self, node: str) -> Config:
        """The config as code on ``node`` itself sees it (a job wrapper, a queue keeper): that
        node alone, reached without SSH."""
        return replace(self, nodes=(replace(self.node(node), transport="local"),))

    def workenv_of(self, node: NodeConfig, asked: WorkEnv) -> WorkEnv:
        """What a job's ``run`` flags, then ``node``'s table, then ``[run]`` say; a venv or a
        conda env asked at one level replaces both of the levels below."""
        levels = (asked, node.workenv, self.run)
        login = next((w.login_shell for w in levels if w.login_shell is not None), True)
        env = next((w for w in levels if w.venv or w.conda), WorkEnv())
        return WorkEnv(login_shell=login, venv=env.venv, conda=env.conda)

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        known = ", ".join(n.name for n in self.nodes)
        raise GpuclaimError(f"unknown node {name!r} (this cluster has: {known})")

    @property
    def storage_path(self) -> Path:
        return Path(self.storage).expanduser()

    @property
    def store_root_on_nodes(self) -> str:
        """Where a node finds the store (its jobs' wrappers and queue keepers read and write
        it there): the path, or an ``ssh://`` storage's path on its host, mounted alike."""
        if self.storage.startswith("ssh://"):
            return parse_storage_url(self.storage)[1]
        return str(self.storage_path)

    @property
    def ssh_config_path(self) -> Optional[Path]:
        """``$GPUCLAIM_SSH_CONFIG``, else the config's ``ssh_config``, else None (ssh's own)."""
        value = os.environ.get("GPUCLAIM_SSH_CONFIG") or self.ssh_config
        return Path(value).expanduser() if value else None


def redacted(raw: dict[str, Any]) -> dict[str, Any]:
    """The config as parsed, with secrets replaced: for ``config show`` and logs."""
    result = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    slack = result.get("slack")
    if isinstance(slack, dict) and slack.get("webhook_url"):
        slack["webhook_url"] = "<redacted>"
    return result


def local_config() -> Config:
    """No config file: this machine is the only node; the store lives in the user's data dir."""
    return Config(
        path=None,
        cluster="local",
        nodes=(NodeConfig(name="localhost", host="localhost", transport="local"),),
        storage=str(paths.data_dir() / "store"),
        storage_default=True,
    )


def parse_config(raw: dict[str, Any], path: Optional[Path] = None) -> Config:
    """Validate a parsed TOML document; every problem is a ConfigError naming the key."""
    _no_unknown(raw, _TOP_KEYS, "")
    nodes = _nodes(raw)
    storage = raw.get("storage")
    storage_default = storage is None
    if storage is None:
        storage = str(paths.data_dir() / "store")
    if not isinstance(storage, str) or not storage.strip():
        raise ConfigError("'storage' must be a path or ssh://HOST/PATH")

    cluster = _str(raw, "cluster", "gpuclaim")
    user = _user(raw.get("user"))
    ssh_config = raw.get("ssh_config")
    if ssh_config is not None and not isinstance(ssh_config, str):
        raise ConfigError("'ssh_config' must be a path")
    agent_command = raw.get("agent_command")
    if agent_command is not None and (not isinstance(agent_command, str) or not agent_command):
        raise ConfigError("'agent_command' must be a command line (a string)")
    ssh_client = _str(raw, "ssh_client", "auto")
    if ssh_client not in SSH_CLIENTS:
        raise ConfigError(
            f'\'ssh_client\' must be "auto", "openssh" or "fabric", not {ssh_client!r}'
        )
    limits = _limits(_table(raw, "defaults"))
    slack = _slack(_table(raw, "slack"))
    idle = _idle(_table(raw, "idle"))
    queue = _queue(_table(raw, "queue"))
    _no_unknown(_table(raw, "run"), {*_WORKENV_KEYS, "keep_copies", "sync_max"}, "run")
    run = _workenv(_table(raw, "run"), "run")
    keep_copies = _duration(_table(raw, "run"), "keep_copies", DEFAULT_KEEP_COPIES_S, "run")
    sync_max = size_setting(_table(raw, "run").get("sync_max"), "'sync_max'", 1 << 30)
    remote = [n.name for n in nodes if n.transport != "local"]
    if storage_default and remote:
        # This machine's own store would be a claim pool that the nodes never see.
        raise ConfigError(
            f"no 'storage' for a cluster with remote nodes ({', '.join(remote[:3])}): "
            'set storage = "/shared/gpuclaim" (a directory every node and this machine '
            'mount at that path) or storage = "ssh://NODE/srv/gpuclaim"'
        )
    return Config(
        path=path,
        cluster=cluster,
        nodes=nodes,
        storage=storage.strip(),
        ssh_config=ssh_config,
        user=user,
        agent_command=agent_command,
        ssh_client=ssh_client,
        limits=limits,
        slack=slack,
        idle=idle,
        queue=queue,
        share=parse_share_policy(_table(raw, "share")),
        run=run,
        keep_copies_s=keep_copies,
        sync_max_bytes=sync_max,
        raw=raw,
        storage_default=storage_default,
    )


def _nodes(raw: dict[str, Any]) -> tuple[NodeConfig, ...]:
    """``nodes`` and their ``[node.NAME]`` tables: names valid, none twice, no stray table."""
    nodes_raw = raw.get("nodes", ["localhost"])
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ConfigError("'nodes' must be a non-empty list of host names, e.g. [\"node01\"]")
    node_tables = _table(raw, "node")
    names: list[str] = []
    for item in nodes_raw:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"'nodes' entries must be host names (strings), got {item!r}")
        name = item.strip()
        if name not in LOCAL_NAMES:
            _check_node_name(name)
        if name in names:
            raise ConfigError(f"node {name!r} is listed twice in 'nodes'")
        names.append(name)
    for extra in node_tables:
        if extra not in names:
            raise ConfigError(f"[node.{extra}] describes a node that is not in 'nodes'")
    return tuple(_node(name, _table(node_tables, name, f"node.{name}")) for name in names)


def _user(user: Any) -> Optional[str]:
    if user is None:
        return None
    if not isinstance(user, str):
        raise ConfigError("'user' must be a string")
    try:
        validate_name(user, "user name")
    except GpuclaimError as exc:
        raise ConfigError(f"'user': {exc.message}") from exc
    return user


def _node(name: str, table: dict[str, Any]) -> NodeConfig:
    _no_unknown(table, _NODE_KEYS, f"node.{name}")
    host = _str(table, "host", name, f"node.{name}.")
    transport = _transport(table, name, default="local" if host in LOCAL_NAMES else "ssh")
    smi = table.get("nvidia_smi", ())
    if isinstance(smi, str):
        smi = shlex.split(smi)
    if not isinstance(smi, (list, tuple)) or not all(isinstance(a, str) for a in smi):
        raise ConfigError(f"'node.{name}.nvidia_smi' must be a command (string or list)")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"'node.{name}.env' must be a table of strings")
    return NodeConfig(
        name=name,
        host=host,
        transport=transport,
        nvidia_smi=tuple(smi),
        env=tuple(sorted(env.items())),
        workenv=_workenv(table, f"node.{name}"),
    )


def _transport(table: dict[str, Any], name: str, default: Transport) -> Transport:
    value = _str(table, "transport", default, f"node.{name}.")
    for transport in TRANSPORTS:
        if value == transport:
            return transport
    raise ConfigError(f'\'node.{name}.transport\' must be "local" or "ssh", not {value!r}')


def _workenv(table: dict[str, Any], where: str) -> WorkEnv:
    """``login_shell``, ``venv``, ``conda`` of [run] or a [node.X] table."""
    login = table.get("login_shell")
    if login is not None and not isinstance(login, bool):
        raise ConfigError(f"'{where}.login_shell' must be true or false, not {login!r}")
    found: dict[str, Optional[str]] = {}
    for key in ("venv", "conda"):
        value = table.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ConfigError(f"'{where}.{key}' must be a non-empty string, not {value!r}")
        found[key] = value.strip() if isinstance(value, str) else None
    if found["venv"] and found["conda"]:
        raise ConfigError(f"'{where}' sets both venv and conda: a job runs in one of them")
    return WorkEnv(login_shell=login, venv=found["venv"], conda=found["conda"])


def _limits(table: dict[str, Any]) -> Limits:
    _no_unknown(table, _DEFAULT_KEYS, "defaults")
    base = Limits()
    default_time = _duration(table, "time", base.default_time_s)
    max_time = _duration(table, "max_time", base.max_time_s)
    if "time" not in table:
        default_time = min(default_time, max_time)
    if default_time > max_time:
        raise ConfigError("'defaults.time' is longer than 'defaults.max_time'")
    ignore = table.get("ignore_processes", list(base.ignore_processes))
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise ConfigError("'defaults.ignore_processes' must be a list of process names")
    return Limits(
        default_time_s=default_time,
        max_time_s=max_time,
        max_service_time_s=_duration(table, "max_service_time", base.max_service_time_s),
        max_gpus_per_user=_int(table, "max_gpus_per_user", base.max_gpus_per_user),
        busy_memory_mib=_int(table, "busy_memory_mib", base.busy_memory_mib),
        ignore_processes=tuple(ignore),
        probe_timeout_s=_duration(table, "probe_timeout", base.probe_timeout_s),
        connect_timeout_s=_duration(table, "connect_timeout", base.connect_timeout_s),
        deadline_s=_duration(table, "deadline", base.deadline_s),
        kill_grace_s=_duration(table, "kill_grace", base.kill_grace_s),
        heartbeat_s=_duration(table, "heartbeat", base.heartbeat_s),
        warm_agent=_bool(table, "warm_agent", base.warm_agent),
        agent_idle_s=_duration(table, "agent_idle", base.agent_idle_s),
        gpu_read_max_age_s=_duration(table, "gpu_read_max_age", base.gpu_read_max_age_s),
        reserve_grace_s=_duration(table, "reserve_grace", base.reserve_grace_s),
        max_reservation_s=_duration(table, "max_reservation", base.max_reservation_s),
        reserve_ahead_s=_duration(table, "reserve_ahead", base.reserve_ahead_s),
        max_reserved_gpu_hours=_number(table, "max_reserved_gpu_hours"),
        keep_reservations_s=_duration(table, "keep_reservations", base.keep_reservations_s),
        max_queued_per_user=_int(table, "max_queued_per_user", base.max_queued_per_user),
    )


def _queue(table: dict[str, Any]) -> QueuePolicy:
    _no_unknown(table, _QUEUE_KEYS, "queue")
    base = QueuePolicy()
    half_life = _duration(table, "half_life", base.half_life_s, "queue")
    max_age = _duration(table, "max_age", base.max_age_s, "queue")
    for key, value in (("half_life", half_life), ("max_age", max_age)):
        if not 0 < value < math.inf:  # nan too: TOML reads it as a float
            raise ConfigError(f"'queue.{key}' must be a duration longer than 0, e.g. \"7d\"")
    weights = {}
    for key in ("fairshare_weight", "age_weight"):
        value = table.get(key, getattr(base, key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e12:
            raise ConfigError(f"'queue.{key}' must be a number >= 0, not {value!r}")
        weights[key] = float(value)
    grace = _duration(table, "preempt_grace", base.preempt_grace_s, "queue")
    if not 0 <= grace <= MAX_PREEMPT_GRACE_S:
        raise ConfigError("'queue.preempt_grace' must be a duration from 0s to 1h, e.g. \"60s\"")
    return QueuePolicy(half_life_s=half_life, max_age_s=max_age, preempt_grace_s=grace, **weights)


def _number(table: dict[str, Any], key: str) -> float:
    value = table.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"'defaults.{key}' must be a number >= 0, not {value!r}")
    return float(value)


def _idle(table: dict[str, Any]) -> IdlePolicy:
    _no_unknown(table, _IDLE_KEYS, "idle")
    base = IdlePolicy()
    threshold = table.get("threshold_pct", base.threshold_pct)
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not (0 <= threshold <= 100)
    ):
        raise ConfigError("'idle.threshold_pct' must be a number from 0 to 100")
    for key in ("warn", "release_jobs"):
        if key in table and not isinstance(table[key], bool):
            raise ConfigError(f"'idle.{key}' must be true or false")
    release = table.get("release_after")
    return IdlePolicy(
        window_s=_duration(table, "window", base.window_s, "idle"),
        threshold_pct=float(threshold),
        warn=bool(table.get("warn", base.warn)),
        release_after_s=None
        if release in (None, "", False)
        else _duration(table, "release_after", 0, "idle"),
        release_jobs=bool(table.get("release_jobs", base.release_jobs)),
    )


def _slack(table: dict[str, Any]) -> SlackConfig:
    _no_unknown(table, _SLACK_KEYS, "slack")
    url = _str(table, "webhook_url", "", "slack.")
    if url and not url.startswith(("https://", "http://")):
        raise ConfigError("'slack.webhook_url' must be an http(s) URL")
    mentions = table.get("mentions", {})
    if not isinstance(mentions, dict):
        raise ConfigError("'slack.mentions' must be a table of user = \"MEMBER_ID\"")
    for who, member in mentions.items():
        # the id goes raw into <@...>: only a member id's characters may get there
        if not isinstance(member, str) or not re.fullmatch(r"[UW][A-Z0-9]{2,}", member):
            raise ConfigError(
                f"'slack.mentions.{who}' must be a Slack member id like \"U024BE7LH\""
            )
    events = table.get("events", [])
    opt_out = table.get("opt_out", [])
    for key, value in (("events", events), ("opt_out", opt_out)):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"'slack.{key}' must be a list of strings")
    return SlackConfig(
        webhook_url=url,
        events=tuple(events),
        mentions=tuple(sorted((str(k), str(v)) for k, v in mentions.items())),
        opt_out=tuple(opt_out),
        timeout_s=_duration(table, "timeout", 3.0, "slack"),
    )


def _check_node_name(name: str) -> None:
    # Host aliases end up in file names and tmux sessions: no spaces, slashes or shell syntax.
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_@")
    if not set(name) <= allowed or name.startswith(("-", ".")):
        raise ConfigError(f"node name {name!r} is not a valid host alias")


def _table(raw: dict[str, Any], key: str, label: Optional[str] = None) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        if key == "node" and isinstance(value, list):  # the list of hosts is 'nodes'
            raise ConfigError("'node' must be a table ([node.NAME]): did you mean 'nodes'?")
        raise ConfigError(f"'{label or key}' must be a table ([{label or key}])")
    return value


def _no_unknown(table: dict[str, Any], known: set[str], where: str) -> None:
    for key in table:
        if key not in known:
            place = f"[{where}]" if where else "the top level"
            close = closest(str(key), known)
            if close:
                raise ConfigError(f"unknown key {key!r} in {place}: did you mean {close!r}?")
            raise ConfigError(
                f"unknown key {key!r} in {place}", hint=f"known keys: {', '.join(sorted(known))}"
            )


def _str(table: dict[str, Any], key: str, default: str, prefix: str = "") -> str:
    value = table.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"'{prefix}{key}' must be a string, not {type(value).__name__}")
    return value


def _bool(table: dict[str, Any], key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"'defaults.{key}' must be true or false, not {value!r}")
    return value


def _int(table: dict[str, Any], key: str, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"'defaults.{key}' must be a whole number >= 0, not {value!r}")
    return value


def _duration(table: dict[str, Any], key: str, default: float, section: str = "defaults") -> float:
    """A duration setting of ``[section]``; an error names it in full (``'slack.timeout'``)."""
    value = table.get(key)
    if value is None:
        return default
    name = f"{section}.{key}"
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"'{name}' must be a duration like \"4h\"")
    try:
        return duration_setting(value)
    except GpuclaimError as exc:
        raise ConfigError(f"'{name}': {exc.message}") from exc


def size_setting(value: Any, name: str, default: int) -> int:
    """A size in a config or project file: "4GiB" or a number of bytes, more than zero."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f'{name} must be a size like "4GiB"')
    try:
        size = parse_bytes(value) if isinstance(value, str) else value
    except GpuclaimError as exc:
        raise ConfigError(f"{name}: {exc.message}") from exc
    if size <= 0:
        raise ConfigError(f'{name} must be more than zero, e.g. "4GiB"')
    return size


def parse_storage_url(url: str) -> tuple[str, str]:
    """``ssh://node01/srv/gpuclaim`` -> ("node01", "/srv/gpuclaim")."""
    parts = urlsplit(url)
    if parts.scheme != "ssh" or not parts.hostname or not parts.path.startswith("/"):
        raise ConfigError(f"'storage' {url!r}: write ssh://HOST/ABSOLUTE/PATH")
    host = parts.hostname if parts.username is None else f"{parts.username}@{parts.hostname}"
    if parts.port:
        raise ConfigError(f"'storage' {url!r}: put the port in your ssh config, not the URL")
    return host, parts.path
