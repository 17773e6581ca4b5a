#!/usr/bin/env python3
"""A busy day stays fast: every read-mostly command on a store that holds a day's work,
against the same cluster with an empty store (goal: busy <= 1.3x empty).

Two demo sandboxes (``gpuclaim.app.sandbox.create_sandbox``: two local nodes with simulated
GPUs) in a temporary directory. In both, user frank claims every GPU the demo leaves free,
for two days, so nothing queued can start and every command sees the same full cluster; in
both, four plain jobs wait in the queue (one is the target of ``why``). The busy store then
gets, written with the real store API as the engine writes them:

  ended today   10,000 jobs that ended in the last ~20 hours, each with one rank on a demo
                node, its claim and job events in the log: alice's 4,000-task array (about
                1% failed), bob's 3,000-task array (their summaries written by the engine's
                ``note_task_end``), 3,000 plain jobs of carol, dave and erin (succeeded,
                failed, killed)
  queued        3,000: erin's 2,000-task array and 1,000 plain jobs of bob, carol, dave and
                erin, each put there by the real ``enqueue``

Each command is run as a user types it: a new ``python -m gpuclaim --config CFG ...``
process as alice, warmed once per store, then the median of ``--repeat`` runs, the empty
and the busy store alternating in the same loop so that machine noise hits both alike.
``jobs --all`` reads the history by design: it is reported, not held to the goal.

    python bench/busy_day.py [--repeat 5] [--scale 0.05] [--keep DIR] [--json]
                             [--profile "jobs"]

``--scale F`` shrinks every count (0.05 for a quick try); ``--keep DIR`` builds the sandboxes
in DIR and leaves them there (a later run with the same DIR reuses them); ``--profile CMD``
runs CMD on the busy store under cProfile and prints its top 25 lines by cumulative time.
Building the full store took 20 s on 2 cores, the whole run about 2 minutes (fsync is
skipped while the store is written: the files are the same, durability is not measured).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuclaim.app.sandbox import create_sandbox  # noqa: E402
from gpuclaim.core.arrays import ARRAY_ID_PREFIX, task_name  # noqa: E402
from gpuclaim.core.events import claim_event, job_event  # noqa: E402
from gpuclaim.core.model import ArrayRef, Claim, ClaimedGpu, EventType, Job, JobRank  # noqa: E402
from gpuclaim.core.records import ArrayRecord  # noqa: E402
from gpuclaim.core.states import JobState  # noqa: E402
from gpuclaim.engine.array_records import note_task_end, note_task_start, task_id  # noqa: E402
from gpuclaim.engine.claims import CLAIM_MARGIN_S  # noqa: E402
from gpuclaim.engine.jobs import RunRequest, enqueue, job_from_request, new_job_id  # noqa: E402
from gpuclaim.store import ClaimStore, new_claim_id  # noqa: E402

HOUR = 3600.0
GOAL = 1.3
USER = "alice"  # who types the commands
HOLDER = "frank"  # who holds every free GPU, in both stores
META = "busy_day.json"  # in --keep DIR: what was built, and when
REUSE_MAX_AGE_S = 3 * HOUR  # older: today's oldest jobs near a day's age (the archive's)

# The busy store's counts at --scale 1.
COUNTS = {
    "alice_array": 4000,  # ended today
    "bob_array": 3000,  # ended today
    "plain_ended": 3000,  # carol, dave, erin: ended today
    "erin_array": 2000,  # queued
    "plain_queued": 1000,  # bob, carol, dave, erin: queued (the first SHARED in both stores)
}
QUEUE_USERS = ("bob", "carol", "dave", "erin")
SHARED = len(QUEUE_USERS)  # queued plain jobs in both stores: next-0 .. next-3
WHY_TARGET = f"next-{QUEUE_USERS.index('erin')}"  # one of erin's queued plain jobs
PLAIN_USERS = {"carol": "train", "dave": "finetune", "erin": "render"}

# (label, arguments, expected exit code, note); a note means: not held to the goal.
COMMANDS: list[tuple[str, list[str], int, str]] = [
    ("status", ["status"], 0, ""),
    ("status --json", ["status", "--json"], 0, ""),
    ("jobs", ["jobs"], 0, ""),
    ("jobs --json", ["jobs", "--json"], 0, ""),
    ("jobs --all", ["jobs", "--all"], 0, "reads the history by design"),
    (f"why {WHY_TARGET}", ["why", WHY_TARGET], 0, ""),
    ("history", ["history"], 0, ""),
    ("claim -n 1", ["claim", "-n", "1"], 3, ""),  # nothing free: exit 3, the real path
    ("reserve --list", ["reserve", "--list"], 0, ""),
    ("board --once", ["board", "--once", "--size", "120x40"], 0, ""),
]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ``python -m cProfile`` prints nothing for gpuclaim, which leaves through os._exit (see
# entry/main.py run()): the same main(), profiled from its first import to its return.
PROFILED = """
import cProfile, pstats, sys
sys.argv = ["gpuclaim", *sys.argv[1:]]
prof = cProfile.Profile()
prof.enable()
from gpuclaim.entry.main import main
code = main()
prof.disable()
sys.stdout.flush()
print(f"\\n-- exit {code} --")
pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(TOP)
"""


def gpuclaim(
    config: Path, args: list[str], user: str = USER, launcher: tuple[str, ...] = ("-m", "gpuclaim")
) -> subprocess.CompletedProcess[str]:
    """One command as typed: a new process, the sandbox's config, ``user`` asking."""
    env = dict(os.environ, GPUCLAIM_USER=user)
    env.pop("GPUCLAIM_CONFIG", None)
    cmd = [sys.executable, *launcher, "--config", str(config), *args]
    return subprocess.run(
        cmd, env=env, cwd=REPO, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )


def checked(
    config: Path, args: list[str], expect: int = 0, user: str = USER
) -> subprocess.CompletedProcess[str]:
    proc = gpuclaim(config, args, user)
    if proc.returncode != expect:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(
            f"gpuclaim {' '.join(args)} (as {user}, {config}) exited {proc.returncode}, "
            f"expected {expect}"
        )
    return proc


def fill_cluster(config: Path) -> dict[str, dict[int, str]]:
    """frank claims every free GPU for two days (nothing queued can start); the demo's GPU
    UUIDs by node and index."""
    rows = json.loads(checked(config, ["status", "--json"]).stdout)
    uuids: dict[str, dict[int, str]] = {}
    free: Counter[str] = Counter()
    for row in rows:
        uuids.setdefault(row["node"], {})[int(row["index"])] = row["uuid"]
        free[row["node"]] += row["state"] == "free"
    for node, count in sorted(free.items()):
        if count:
            args = ["claim", "-n", str(count), "--node", node, "--time", "2d", "--note", "bench"]
            checked(config, args, user=HOLDER)
    if any(r["state"] == "free" for r in json.loads(checked(config, ["status", "--json"]).stdout)):
        raise SystemExit(f"{config}: GPUs still free after frank's claims")
    return uuids


def open_store(directory: Path) -> ClaimStore:
    return ClaimStore(directory / "store", host_lock_dir=directory / "hostlocks")


class Builder:
    """Writes a day's records into one sandbox's store, as the engine writes them."""

    def __init__(self, directory: Path, uuids: dict[str, dict[int, str]], seed: int) -> None:
        self.store = open_store(directory)
        self.uuids = uuids
        self.rng = random.Random(seed)
        self.now = self.store.now()
        self.events: list[Any] = []  # appended in time order at the end
        self.home = directory / "home"

    # -- the queue ------------------------------------------------------------------------

    def queue_plain(self, index: int) -> Job:
        """A plain queued job, as ``submit_job`` queues one: record, entry, event."""
        rng = self.rng
        user = QUEUE_USERS[index % len(QUEUE_USERS)]
        req = RunRequest(
            user=user,
            argv=("python", "train.py", "--trial", str(index)),
            name=f"next-{index}",
            count=rng.choice((1, 1, 2, 4)),
            nice=10 if index % 7 == 6 else 0,
            queue=True,
        )
        time_s = rng.choice((1, 2, 4, 12)) * HOUR
        job = job_from_request(req, new_job_id(), req.name or "", time_s, self.store.now())
        job = self.store.create_job(job=job)
        enqueue(self.store, job)
        self.store.append_event(job_event(EventType.JOB_QUEUED, job, job.submitted))
        return job

    def queue_array(self, user: str, name: str, count: int) -> None:
        """A queued array, as ``submit_array`` writes one (no dispatch: nothing is free)."""
        req = RunRequest(user=user, argv=("python", "sweep.py"), name=name, count=1)
        array_id, ref, now, time_s = self._array(req, count, self.store.now(), 2 * HOUR)
        for index in range(count):
            task = self._task(req, array_id, ref, index, now, time_s)
            task = self.store.create_job(job=task)
            enqueue(self.store, task)
        self.store.append_event(
            job_event(EventType.ARRAY_QUEUED, self._task(req, array_id, ref, 0, now, time_s), now)
        )

    # -- the day's ended jobs -------------------------------------------------------------

    def ended_array(self, user: str, name: str, count: int, failed: float) -> None:
        """An array submitted this morning whose tasks all ended since, summary and all."""
        req = RunRequest(user=user, argv=("python", "eval.py"), name=name, count=1)
        submitted = self.now - 20.5 * HOUR
        array_id, ref, _, time_s = self._array(req, count, submitted, 1 * HOUR)
        tasks = []
        for index in range(count):
            task = self._task(req, array_id, ref, index, submitted, time_s)
            state = JobState.FAILED if self.rng.random() < failed else JobState.SUCCEEDED
            tasks.append(self.store.create_job(job=self._ended(task, state, submitted)))
            if (index + 1) % 1000 == 0:
                log(f"    {user}'s {name}: {index + 1}/{count} tasks")
        first = min(tasks, key=lambda t: t.started or 0.0)
        note_task_start(self.store, first)  # the array's one start message
        for task in tasks:  # each task's end counted; the last writes the summary
            note_task_end(self.store, task)

    def ended_plain(self, index: int) -> None:
        rng = self.rng
        user = rng.choice(sorted(PLAIN_USERS))
        req = RunRequest(
            user=user,
            argv=("python", f"{PLAIN_USERS[user]}.py", "--seed", str(index)),
            name=f"{PLAIN_USERS[user]}-{index}",
            count=rng.choice((1, 1, 1, 2, 4)),
        )
        submitted = self.now - rng.uniform(0.5 * HOUR, 20 * HOUR)
        job = job_from_request(req, new_job_id(), req.name or "", 4 * HOUR, submitted)
        state = rng.choices(
            (JobState.SUCCEEDED, JobState.FAILED, JobState.KILLED), weights=(85, 10, 5)
        )[0]
        self.store.create_job(job=self._ended(job, state, submitted))

    def _array(
        self, req: RunRequest, count: int, submitted: float, time_s: float
    ) -> tuple[str, ArrayRef, float, float]:
        array_id = ARRAY_ID_PREFIX + os.urandom(5).hex()
        ref = ArrayRef(array_id, req.name or "", 0, count, None)
        record: ArrayRecord = {
            "id": array_id,
            "name": req.name or "",
            "user": req.user,
            "spec": f"0-{count - 1}",
            "indices": list(range(count)),
            "count": count,
            "max_running": None,
            "argv": list(req.argv),
            "sweep": False,
            "submitted": submitted,
            "after": [],
        }
        self.store.create_array(array=record)
        return array_id, ref, submitted, time_s

    def _task(
        self, req: RunRequest, array_id: str, ref: ArrayRef, index: int, now: float, time_s: float
    ) -> Job:
        env = dict(req.env)
        env.update(
            GPUCLAIM_ARRAY_JOB=array_id,
            GPUCLAIM_ARRAY_NAME=ref.name,
            GPUCLAIM_ARRAY_INDEX=str(index),
            GPUCLAIM_ARRAY_COUNT=str(ref.count),
        )
        return job_from_request(
            replace(req, env=tuple(env.items())),
            task_id(array_id, index),
            task_name(ref.name, index),
            time_s,
            now,
            array=replace(ref, index=index),
        )

    def _ended(self, job: Job, state: JobState, submitted: float) -> Job:
        """The record a finished wrapper leaves (started from the queue on a demo node, its
        rank ended, its claim given back), and that life's four events."""
        rng = self.rng
        node = "demo01" if job.gpus_per_node > 2 else rng.choice(sorted(self.uuids))
        indices = sorted(rng.sample(sorted(self.uuids[node]), job.gpus_per_node))
        started = rng.uniform(submitted + 30.0, self.now - 15 * 60.0)
        # short runs: 10,000 of them fill the demo's 7 GPUs for the day about once over
        length = rng.uniform(20.0, 70.0) if job.array else rng.uniform(20.0, 90.0)
        ended = min(started + length, self.now - 60.0)
        code = {JobState.SUCCEEDED: 0, JobState.FAILED: 1, JobState.KILLED: 143}[state]
        reason = {JobState.SUCCEEDED: "", JobState.FAILED: "exit status 1"}.get(state, "kill")
        claim = Claim(
            id=new_claim_id(),
            user=job.user,
            node=node,
            gpus=tuple(ClaimedGpu(self.uuids[node][i], i) for i in indices),
            since=started,
            expires=started + job.time_limit_s + CLAIM_MARGIN_S,
            note=f"job {job.name}",
            job=job.id,
            host="bench",
            pid=1,
        )
        rank = JobRank(
            rank=0,
            node=node,
            gpus=tuple(indices),
            gpu_uuids=tuple(g.uuid for g in claim.gpus),
            claim_id=claim.id,
            state=state,
            exit_code=code,
            log=str(self.home / job.user / ".gpuclaim" / "jobs" / job.id / "rank0" / "output.log"),
            started=started,
            ended=ended,
            workdir=str(self.home / job.user),
        )
        running = job.with_(state=JobState.RUNNING, ranks=(rank,), started=started)
        final = running.with_(
            state=state,
            ended=ended,
            exit_code=code,
            reason=reason,
            from_queue=True,
            stop_requested="kill" if state == JobState.KILLED else None,
        )
        self.events += [
            claim_event(EventType.CLAIM, claim, started),
            job_event(EventType.JOB_START, running, started),
            claim_event(EventType.RELEASE, claim, ended),
            job_event(EventType.JOB_END, final, ended),
        ]
        return final

    def flush_events(self) -> int:
        self.events.sort(key=lambda e: e.ts)
        for event in self.events:
            self.store.append_event(event)
        count, self.events = len(self.events), []
        return count


def scaled(scale: float) -> dict[str, int]:
    counts = {k: max(1, round(v * scale)) for k, v in COUNTS.items()}
    counts["plain_queued"] = max(SHARED, counts["plain_queued"])
    return counts


def build(base: Path, scale: float, seed: int = 1) -> dict[str, Path]:
    """Both sandboxes, their clusters full; the busy one holding a day's work."""
    configs = {}
    for label in ("empty", "busy"):
        configs[label] = create_sandbox(base / label, reset=True)
    counts = scaled(scale)
    # fsync skipped while writing (the files are the same; 26,000 of them took most of it)
    with mock.patch("os.fsync", lambda fd: None):
        for label, config in configs.items():
            log(f"  {label}: frank claims every free GPU")
            uuids = fill_cluster(config)
            b = Builder(config.parent, uuids, seed)
            for i in range(SHARED):  # the same few queued jobs in both stores
                b.queue_plain(i)
            if label == "empty":
                continue
            t0 = time.monotonic()
            b.ended_array("alice", "sweep", counts["alice_array"], failed=0.01)
            b.ended_array("bob", "ablate", counts["bob_array"], failed=0.005)
            log(f"    arrays ended: {time.monotonic() - t0:.0f} s")
            for i in range(counts["plain_ended"]):
                b.ended_plain(i)
                if (i + 1) % 1000 == 0:
                    log(f"    plain jobs ended: {i + 1}/{counts['plain_ended']}")
            log(f"    events: {b.flush_events()} written")
            b.queue_array("erin", "grid", counts["erin_array"])
            for i in range(SHARED, counts["plain_queued"]):
                b.queue_plain(i)
            log(f"    queued; busy store built in {time.monotonic() - t0:.0f} s")
    meta = {"built": time.time(), "scale": scale, "counts": counts}
    (base / META).write_text(json.dumps(meta) + "\n", encoding="utf-8")
    return configs


def reuse(base: Path, scale: float) -> Optional[dict[str, Path]]:
    """The sandboxes kept in ``base``, if they are there, of this scale and still today's."""
    try:
        meta = json.loads((base / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    configs = {label: base / label / "config.toml" for label in ("empty", "busy")}
    if not all(c.exists() for c in configs.values()) or meta.get("scale") != scale:
        return None
    age = time.time() - float(meta.get("built") or 0)
    if age > REUSE_MAX_AGE_S:
        log(f"  the kept stores are {age / HOUR:.1f} h old: built again")
        return None
    for config in configs.values():  # a claim of frank's that ended: taken again
        fill_cluster(config)
    return configs


def census(directory: Path) -> dict[str, Any]:
    """What one store holds: jobs by state, queue entries, arrays, events."""
    store = open_store(directory)
    states = Counter(j.state for j in store.list_jobs())
    events = sum(
        len(p.read_bytes().splitlines()) for p in (directory / "store" / "events").glob("*.jsonl")
    )
    return {
        "jobs": dict(sorted(states.items())),
        "queued_entries": len(store.queue_entries()),
        "arrays": len(store.list_arrays()),
        "events": events,
        "claims": len(store.snapshot().claims),
    }


def time_commands(configs: dict[str, Path], repeat: int) -> list[dict[str, Any]]:
    rows = []
    for label, args, expect, note in COMMANDS:
        for which in ("empty", "busy"):  # warm: the page cache, and what a first call keeps
            checked(configs[which], args, expect)
        samples: dict[str, list[float]] = {"empty": [], "busy": []}
        for r in range(repeat):
            for which in ("empty", "busy") if r % 2 == 0 else ("busy", "empty"):
                t0 = time.perf_counter()
                checked(configs[which], args, expect)
                samples[which].append(time.perf_counter() - t0)
        empty, busy = (statistics.median(samples[w]) for w in ("empty", "busy"))
        ratio = busy / empty
        rows.append(
            {
                "command": label,
                "empty_s": round(empty, 3),
                "busy_s": round(busy, 3),
                "ratio": round(ratio, 2),
                "goal": None if note else GOAL,
                "met": None if note else ratio <= GOAL,
                "note": note,
            }
        )
        log(f"  {label:<16} {empty:6.3f} s  {busy:6.3f} s  {ratio:5.2f}x")
    return rows


def profile(config: Path, command: str, top: int = 25) -> str:
    """The busy store's ``command`` under cProfile, its top lines by cumulative time."""
    launcher = ("-c", PROFILED.replace("TOP", str(top)))
    proc = gpuclaim(config, shlex.split(command), launcher=launcher)
    lines = proc.stdout.replace(str(REPO) + "/", "").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("-- exit ")), None)
    head = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), None)
    if start is None or head is None or proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"no cProfile output for {command!r} (exit {proc.returncode})")
    total = next((line.strip() for line in lines[start:] if "function calls" in line), "")
    code = lines[start].strip("- ")
    return "\n".join([f"gpuclaim {command} ({code}): {total}", *lines[head:][: top + 1]])


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def report(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(
        f"busy day: every command, empty store vs a day's work "
        f"({m['platform']}, {m['cpus']} CPUs, Python {m['python']})"
    )
    busy, empty = result["stores"]["busy"], result["stores"]["empty"]
    jobs = busy["jobs"]
    ended = sum(n for s, n in jobs.items() if s != JobState.QUEUED)
    by_state = ", ".join(f"{n} {s}" for s, n in jobs.items())
    print(
        f"  busy store: {ended} jobs ended today (records: {by_state}), "
        f"{busy['queued_entries']} queued, {busy['arrays']} arrays, {busy['events']} events"
    )
    print(
        f"  empty store: {empty['queued_entries']} queued, {empty['events']} events; "
        f"both: {busy['claims']} claims of {HOLDER} hold every free GPU"
    )
    print(f"  median of {result['repeat']} runs after a warm-up, a new process each, as {USER}")
    print(f"  {'command':<16}{'empty s':>9}{'busy s':>9}{'ratio':>8}  {'goal':<7} met?")
    for row in result["commands"]:
        goal = f"<={row['goal']}x" if row["goal"] else "-"
        met = {True: "yes", False: "NO", None: row["note"]}[row["met"]]
        print(
            f"  {row['command']:<16}{row['empty_s']:>9.3f}{row['busy_s']:>9.3f}"
            f"{row['ratio']:>7.2f}x  {goal:<7} {met}"
        )
    held = [r for r in result["commands"] if r["goal"]]
    print(f"  goal met by {sum(r['met'] for r in held)} of {len(held)} commands")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per command and store")
    ap.add_argument("--scale", type=float, default=1.0, help="shrink every count (0.05: quick)")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="build in DIR and leave it there")
    ap.add_argument("--profile", metavar="CMD", help='e.g. "jobs": cProfile of it, busy store')
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    if args.repeat < 1 or args.scale <= 0:
        ap.error("--repeat must be at least 1 and --scale above 0")
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gcbusy-") as tmp:
        base = args.keep.resolve() if args.keep else Path(tmp)
        configs = reuse(base, args.scale) if args.keep else None
        if configs is None:
            log(f"building the stores in {base} (scale {args.scale})")
            t0 = time.monotonic()
            configs = build(base, args.scale)
            log(f"  built in {time.monotonic() - t0:.0f} s")
        else:
            log(f"reusing the stores in {base}")
        result: dict[str, Any] = {
            "machine": machine(),
            "repeat": args.repeat,
            "scale": args.scale,
            "stores": {label: census(c.parent) for label, c in configs.items()},
        }
        log("timing (empty, busy, ratio):")
        result["commands"] = time_commands(configs, args.repeat)
        if args.profile:
            result["profile"] = profile(configs["busy"], args.profile)
        result["wall_s"] = round(time.monotonic() - t_start, 1)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
        if args.profile:
            print(f"\n-- cProfile, busy store --\n{result['profile']}")
        print(f"  (whole run {result['wall_s']:.0f} s)")
    if args.keep:
        for label, config in configs.items():
            print(f"kept {label}: {config}", file=sys.stderr)


if __name__ == "__main__":
    main()
