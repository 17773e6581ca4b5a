#!/usr/bin/env python3
"""``run --sync`` of a project tree against plain ``rsync -a`` over the same SSH, same node,
same run.

    python bench/sync.py [--mb 200] [--files 2000] [--repeat 3]

The tree: ``--files`` files, ``--mb`` MB in all (a few large incompressible files and many
small ones, as code plus a small dataset). Each measured:
  rsync first   ``rsync -a -e 'ssh <the same master>' tree/ node:plain/`` into an empty dir
  rsync incr    the same again after 20 small files changed (rsync's own in-place update)
  sync first    ``gpuclaim run --sync -- true`` with no earlier copy on the node: the copy's
                own time as the job records it (``synced.seconds``), and the whole ``run``
  sync incr     the same after the same 20 changes: a new copy per job, started from the
                spare tree the node copied after the previous copy, updated in place
  spare built   from that run's return until the node's spare for the next copy is there
                (the builder, detached: off the copy's path)
  no spare      the same with the spare removed first (two runs of a project at once: one
                of them starts from a copy of the newest copy, made on the node)
  back to back  a run started as soon as the previous one returned (its copy waits for the
                builder still at work, or copies the newest copy itself)
Medians of ``--repeat``; odd rounds run gpuclaim before plain rsync (the page cache and
writeback of one must not count against the other); at the end, the disk the last round's
copies and spare take (``du``: a file shared by hard links counts once). The target
([workenv]): sync incr <= 1.2x rsync incr; [hardening-3]: no two copies share a file.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from testbed import Testbed  # noqa: E402

from gpuclaim.app.configfile import render_config  # noqa: E402


def make_tree(root: Path, mb: int, files: int) -> list[Path]:
    """``files`` files, ``mb`` MB: 10 large ones carry 90 % of it, the rest are small."""
    big_n = 10
    big = int(mb * 1e6 * 0.9 / big_n)
    small = int(mb * 1e6 * 0.1 / max(1, files - big_n))
    small_files = []
    for i in range(files):
        sub = root / f"pkg{i % 20:02d}" / f"mod{i % 7}"
        sub.mkdir(parents=True, exist_ok=True)
        path = sub / (f"data{i}.bin" if i < big_n else f"file{i}.py")
        path.write_bytes(os.urandom(big if i < big_n else small))
        if i >= big_n:
            small_files.append(path)
    return small_files


# what a copy without a spare started from: "link-dest" before [hardening-3] (kept to
# measure that code with this script)
NO_SPARE = {"previous", "link-dest"}


def touch_some(small: list[Path], round_: int) -> None:
    for path in small[round_ * 20 : round_ * 20 + 20]:
        path.write_bytes(os.urandom(path.stat().st_size))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    compileall.compile_dir(str(REPO / "gpuclaim"), quiet=1)  # as installed (see fanout.py)
    if not shutil.which("rsync"):
        raise SystemExit("bench/sync.py needs rsync (apt-get install rsync)")
    work = Path(tempfile.mkdtemp(prefix="gcsync-"))
    tb = Testbed.up(1, gpus=4)
    try:
        node = tb.nodes[0]
        env = {**os.environ, **tb.env()}
        tree = work / "project"
        small = make_tree(tree, args.mb, args.files)
        (work / "store").mkdir()
        config = work / "config.toml"
        config.write_text(
            render_config(
                cluster="bench",
                nodes=tb.nodes,
                storage=str(work / "store"),
                ssh_config=str(tb.ssh_config),
            )
        )
        runtime = Path(tempfile.mkdtemp(prefix="gcs-", dir="/tmp"))  # short socket paths
        genv = {
            **env,
            "GPUCLAIM_CONFIG": str(config),
            "GPUCLAIM_HOME": str(work / "home"),
            "XDG_RUNTIME_DIR": str(runtime),
        }
        # the master gpuclaim keeps, so both sides reuse one connection
        subprocess.run(
            [sys.executable, "-m", "gpuclaim", "status", "--json"], env=genv, capture_output=True
        )
        ssh = (
            f"ssh -F {tb.ssh_config} -o ControlMaster=auto"
            f" -o ControlPath={runtime}/gpuclaim-cm/%C -o ControlPersist=10m"
        )
        home = tb.node_dir(node) / "home"

        def plain(dest: str) -> float:
            t0 = time.perf_counter()
            subprocess.run(
                ["rsync", "-a", "-e", ssh, f"{tree}/", f"{node}:{dest}/"], env=env, check=True
            )
            return time.perf_counter() - t0

        synced = home / ".cache" / "gpuclaim" / "sync"

        def sync(name: str, *starts: str) -> tuple[float, float]:
            t0 = time.perf_counter()
            argv = ["run", "--name", name, "--sync", "--json", "--", "true"]
            proc = subprocess.run(
                [sys.executable, "-m", "gpuclaim", *argv],
                env=genv,
                cwd=tree,
                capture_output=True,
                text=True,
            )
            whole = time.perf_counter() - t0
            if proc.returncode != 0:
                raise SystemExit(f"run --sync failed: {proc.stderr.strip()}")
            copied = json.loads(proc.stdout)["synced"]
            if copied["incremental"][node] not in starts:  # measure what the row says
                raise SystemExit(f"{name}: the copy started from {copied['incremental']}")
            return float(copied["seconds"]), whole

        def spare_ready() -> None:
            deadline = time.monotonic() + 30
            while not list(synced.glob("*/.spare")):
                if time.monotonic() > deadline:
                    raise SystemExit("the node built no spare tree")
                time.sleep(0.05)

        def builders_done() -> None:
            deadline = time.monotonic() + 60
            while list(synced.glob("*/.building-*")) and time.monotonic() < deadline:
                time.sleep(0.05)  # a builder still copying would put a spare in the next round

        keys = ["rsync first", "rsync incr", "sync first", "sync incr", "spare built"]
        keys += ["no spare", "back to back", "run first", "run incr"]
        rows: dict[str, list[float]] = {k: [] for k in keys}
        b2b_starts: list[str] = []
        for r in range(args.repeat):
            shutil.rmtree(home / "plain", ignore_errors=True)
            builders_done()
            shutil.rmtree(synced, ignore_errors=True)

            def gpuclaim_first(r: int = r) -> None:
                copy, whole = sync(f"first{r}", "none")
                rows["sync first"].append(copy)
                rows["run first"].append(whole)

            def rsync_first() -> None:
                rows["rsync first"].append(plain(str(home / "plain")))

            for step in (gpuclaim_first, rsync_first)[:: -1 if r % 2 == 0 else 1]:
                step()
            touch_some(small, 3 * r)
            spare_ready()
            rows["rsync incr"].append(plain(str(home / "plain")))
            copy, whole = sync(f"incr{r}", "spare")
            rows["sync incr"].append(copy)
            rows["run incr"].append(whole)
            t0 = time.perf_counter()
            spare_ready()
            rows["spare built"].append(time.perf_counter() - t0)
            touch_some(small, 3 * r + 1)
            for spare in synced.glob("*/.spare"):
                shutil.rmtree(spare)
            rows["no spare"].append(sync(f"nospare{r}", *NO_SPARE)[0])
            touch_some(small, 3 * r + 2)
            rows["back to back"].append(sync(f"b2b{r}", "spare", *NO_SPARE)[0])
            proc = subprocess.run(
                [sys.executable, "-m", "gpuclaim", "jobs", "--all", "--json"],
                env=genv,
                capture_output=True,
                text=True,
            )
            jobs = {j["name"]: j for j in json.loads(proc.stdout)}
            b2b_starts.append(jobs[f"b2b{r}"]["synced"]["incremental"][node])
        spare_ready()
        builders_done()
        du = subprocess.run(["du", "-sm", str(synced)], capture_output=True, text=True)
        disk_mb = int(du.stdout.split()[0])
        table = {k: statistics.median(v) for k, v in rows.items()}
    finally:
        tb.down()
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps({**table, "disk_mb": disk_mb, "back_to_back_starts": b2b_starts}))
        return
    print(f"\nrun --sync, {args.files} files, {args.mb} MB, median of {args.repeat}, seconds")
    for k, v in table.items():
        print(f"{k:<12} {v:8.3f}")
    print(
        f"\nratios: sync first / rsync first {table['sync first'] / table['rsync first']:.2f}"
        f"   sync incr / rsync incr {table['sync incr'] / table['rsync incr']:.2f}"
        f" (target <= 1.2)   no spare / rsync incr {table['no spare'] / table['rsync incr']:.2f}"
    )
    print(f"back to back started from: {', '.join(b2b_starts)}")
    print(f"disk: the last round's 4 copies and the spare take {disk_mb} MB (du)")


if __name__ == "__main__":
    main()
