"""``gpuclaim doctor``: what works on each node, what does not, and how to fix it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from gpuclaim.core.config import Config, NodeConfig, parse_storage_url
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.fanout import fan_out
from gpuclaim.core.model import EventType, NodeInventory
from gpuclaim.core.protocol import DOCTOR, DoctorRequest, DoctorResponse
from gpuclaim.engine.channel import ask
from gpuclaim.engine.cluster import NodeProber
from gpuclaim.remote.channels import NodeChannels
from gpuclaim.store import Store

MAX_SKEW_S = 30.0
MIN_PYTHON = (3, 9)
MOUNT_FIX = "mount the shared storage at the same path on the node"


@dataclass
class NodeHealth:
    """What ``doctor`` found on one node, and what to fix there."""

    node: str
    reachable: bool
    seconds: float = 0.0
    python: Optional[str] = None
    tmux: Optional[str] = None
    gpu_source: Optional[str] = None  # nvml / nvidia-smi / none
    gpus: int = 0
    driver: Optional[str] = None
    storage: Optional[str] = None  # "ok", an error, or None when not checked here
    clock_skew_s: Optional[float] = None  # node clock minus storage clock
    agent: Optional[str] = None
    path: Optional[str] = None  # how requests reach the node: warm agent, one-shot, in-process
    problems: list[tuple[str, str]] = field(default_factory=list)  # (what, how to fix)

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["problems"] = [{"problem": p, "fix": f} for p, f in self.problems]
        return d


def run_doctor(config: Config, store: Store, prober: NodeProber) -> list[NodeHealth]:
    """Check every node in parallel; never raises for a node's problem."""
    storage_offset = _storage_offset(store)
    store_id = _store_id(store)
    mount_fix = _mount_fix(config)
    by_name = {n.name: n for n in config.nodes}
    outcomes = fan_out(
        list(by_name),
        lambda name: _check(config, prober, by_name[name]),
        config.limits.deadline_s,
    )
    report = []
    for name in by_name:
        outcome = outcomes[name]
        if not outcome.ok or outcome.value is None:
            health = NodeHealth(name, reachable=False, seconds=outcome.seconds)
            fix = _ssh_fix(outcome.error, by_name[name].host)
            health.problems.append((f"not reachable: {outcome.error}", fix))
        else:
            facts, offset = outcome.value
            health = _judge(
                name, facts, offset, storage_offset, outcome.seconds, store_id, mount_fix
            )
            health.path = _path_to(prober, by_name[name])
        report.append(health)
    return report


REFUSALS_SHOWN_S = 30 * 86400.0  # refused jobs of the last 30 days


def store_problems(store: Store) -> list[tuple[str, str]]:
    """What in the store could not prove who runs what (``store/owners.py``): files in an
    account's directory that are not its own, and jobs refused lately, with who wrote them."""
    problems = [
        (f"{line}", "remove it: only its account may write there (gpuclaim refuses it)")
        for line in store.misowned_specs()
    ]
    policy = store.policy_problem()
    if policy:
        problems.append((policy, "the store's owner rewrites it: gpuclaim policy set KEY VALUE"))
    events, _ = store.read_events()
    since = store.now() - REFUSALS_SHOWN_S
    for e in events:
        if e.type != EventType.REFUSED or e.ts < since:
            continue
        job_id = e.extra.get("job_id")
        problems.append(
            (
                f"job {job_id} ({e.extra.get('job')}) naming {e.extra.get('account') or e.user}"
                f" was refused by {e.by}: {e.extra.get('why')}",
                "a record in the store that its account did not submit (forged?): see who "
                f"wrote it with ls -l {store.root}/jobs/{job_id}.json",
            )
        )
    return problems


def _check(config: Config, prober: NodeProber, node: NodeConfig) -> tuple[DoctorResponse, float]:
    request = DoctorRequest(
        node=node.name,
        nvidia_smi=list(node.nvidia_smi),
        env=dict(node.env),
        timeout=config.limits.probe_timeout_s,
        # Nodes must see the store at that path, ssh:// storage too: jobs' wrappers use it.
        storage=config.store_root_on_nodes,
    )
    before = time.time()
    channel = prober.channels.to_node(node)
    facts = ask(channel, DOCTOR, request, config.limits.probe_timeout_s + 10)
    after = time.time()
    return facts, float(facts["time"]) - (before + after) / 2


def _judge(
    name: str,
    facts: DoctorResponse,
    offset: float,
    storage_offset: Optional[float],
    secs: float,
    store_id: Optional[str] = None,
    mount_fix: str = MOUNT_FIX,
) -> NodeHealth:
    probed = facts["inventory"]
    inv = NodeInventory.from_dict(probed) if probed else None
    h = NodeHealth(
        name,
        reachable=True,
        seconds=secs,
        python=facts["python"],
        tmux=facts["tmux"],
        gpu_source=inv.source if inv else None,
        gpus=len(inv.gpus) if inv else 0,
        driver=inv.driver_version if inv else None,
        agent=facts["agent_version"],
    )
    version = tuple(int(x) for x in str(h.python or "0.0").split(".")[:2])
    if version < MIN_PYTHON:
        h.problems.append((f"python3 is {h.python}", "install python3 >= 3.9 on the node"))
    if not h.tmux:
        h.problems.append(("tmux is not installed", "apt-get install tmux (jobs run in tmux)"))
    if inv is not None and inv.error:
        h.problems.append(
            (inv.error, "install the NVIDIA driver (nvidia-smi), or set [node.NAME] nvidia_smi")
        )
    elif inv is not None and not inv.gpus:
        h.problems.append(("no GPUs found", "check nvidia-smi -L on the node"))
    off = facts.get("persistence_off")
    if off:
        h.problems.append(
            (
                f"persistence mode is off on GPU {','.join(str(i) for i in off)}: every "
                "nvidia-smi call and NVML start wakes the driver (seconds each on big nodes)",
                "sudo nvidia-smi -pm 1 (or enable the nvidia-persistenced service)",
            )
        )
    storage = facts.get("storage")
    if storage is not None:
        seen_id = storage.get("id")
        if storage["ok"] and store_id and seen_id and seen_id != store_id:
            # the same path, another store: claims made there are invisible here
            h.storage = f"another store at {storage['path']} (id {seen_id}, here {store_id})"
            h.problems.append(
                (
                    f"storage: {h.storage}: two claim pools that never see each other",
                    mount_fix,
                )
            )
        elif storage["ok"]:
            h.storage = "ok"
            if storage_offset is not None:
                h.clock_skew_s = offset - storage_offset
        else:
            h.storage = str(storage.get("error"))
            fix = mount_fix
            if "refuses writes" in h.storage:
                fix = "free space on the storage (df -h) or mount it read-write (mount)"
            h.problems.append((f"storage: {h.storage}", fix))
    elif storage_offset is not None:
        h.clock_skew_s = offset - storage_offset
    if h.clock_skew_s is not None and abs(h.clock_skew_s) > MAX_SKEW_S:
        h.problems.append(
            (
                f"clock is {h.clock_skew_s:+.0f}s off the storage host's",
                "run NTP (chrony or systemd-timesyncd) on the node",
            )
        )
    return h


def _mount_fix(config: Config) -> str:
    """How a node comes to see the store: with ssh:// storage, whose directory to mount."""
    if config.storage.startswith("ssh://"):
        host, root = parse_storage_url(config.storage)
        return f"mount {host}'s {root} on the node at that same path (its jobs use the store there)"
    return MOUNT_FIX


def _store_id(store: Store) -> Optional[str]:
    try:
        return store.store_id()
    except GpuclaimError:
        return None


def _storage_offset(store: Store) -> Optional[float]:
    try:
        before = time.time()
        now = store.now()
        return now - (before + time.time()) / 2
    except GpuclaimError:
        return None


def _ssh_fix(error: Optional[str], host: str) -> str:
    """The fix for an SSH failure, with the node's own name in the commands to try."""
    text = error or ""
    if "HOST KEY CHANGED" in text:
        return f"if the node was reinstalled: ssh-keygen -R {host}, then ssh {host} once"
    if "unknown host key" in text:
        return f"ssh {host} once to check and accept its key"
    if "authentication" in text:
        return f"check your key: ssh {host} true must work without a password"
    return f"check that the node is up and ssh {host} true works"


def _path_to(prober: NodeProber, node: NodeConfig) -> Optional[str]:
    channels = prober.channels
    return channels.path_to(node) if isinstance(channels, NodeChannels) else None
