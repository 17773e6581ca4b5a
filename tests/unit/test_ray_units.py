"""[ray] the parts of a Ray node that need no Ray: its ports (every port a Ray node opens is
one of its block's, blocks held apart by lock files, a dead holder's taken over), its short
temp dir, and how a Ray job's end is its head's."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from gpuclaim.core.model import Job, JobRank
from gpuclaim.engine.job_records import RAY_HEAD_ENDED, _job_outcome
from gpuclaim.node import ray_ports as rp
from gpuclaim.node.ray_node import interpreter, start_argv


@pytest.fixture
def tmp_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(rp.tempfile, "gettempdir", lambda: str(tmp_path))
    return tmp_path


def _ports(argv: list[str]) -> list[int]:
    return [int(m.group(1)) for a in argv if (m := re.match(r"--[a-z-]*port=(\d+)$", a))]


def test_every_port_of_a_head_and_a_worker_is_its_blocks(tmp_locks: Path) -> None:
    block = rp.take_block(random.Random(1))
    head = start_argv("ray", block, "/tmp/t", 2, 1, None, client=True)
    worker = start_argv("ray", block, "/tmp/t", 1, None, "10.0.0.1:20000", client=True)
    for argv in (head, worker):
        ports = _ports(argv)
        assert ports and all(block.base <= p < block.base + rp.BLOCK for p in ports), argv
        assert len(set(ports)) == len(ports)
        assert "--block" in argv and "--temp-dir=/tmp/t" in argv
    assert "--head" in head and f"--port={block.base}" in head and "--num-cpus=1" in head
    assert "--dashboard-host=127.0.0.1" in head
    assert f"--ray-client-server-port={block.port(rp.CLIENT)}" in head
    assert "--address=10.0.0.1:20000" in worker and "--head" not in worker
    assert not any(a.startswith("--num-cpus") for a in worker)  # Ray's own count
    minimal = start_argv("ray", block, "/tmp/t", 1, None, None, client=False)
    assert not any("client" in a for a in minimal)  # minimal Ray refuses the flag
    assert f"--min-worker-port={block.base + rp.FIRST_WORKER}" in head
    assert f"--max-worker-port={block.base + rp.BLOCK - 1}" in head


def test_two_nodes_on_one_machine_never_get_one_block(tmp_locks: Path) -> None:
    first = rp.take_block(random.Random(7))
    second = rp.take_block(random.Random(7))  # the same first choice: held, so another
    assert first.base != second.base
    assert first.lock.read_text() == str(os.getpid())
    first.release()
    assert not first.lock.exists()
    again = rp.take_block(random.Random(7))
    assert again.base == first.base  # free again once released


def test_a_dead_holders_block_is_taken_over(tmp_locks: Path) -> None:
    choice = rp.take_block(random.Random(3))
    choice.lock.write_text("999999999")  # a holder long gone
    assert rp.take_block(random.Random(3)).base == choice.base


def test_the_temp_dir_is_short_for_rays_socket_paths() -> None:
    path = str(rp.temp_dir("j-0123456789", 15))
    # Ray adds /session_<date>_<time>_<pid>/sockets/plasma_store: 107 bytes at most in all
    assert len(path) + len("/session_2026-12-07_01-57-13_273258_4194304/sockets/plasma_store") < 107


def test_interpreter_is_the_scripts_shebang(tmp_path: Path) -> None:
    script = tmp_path / "ray"
    script.write_text("#!/opt/venv/bin/python3 -s\nimport sys\n")
    assert interpreter(str(script)) == "/opt/venv/bin/python3"
    assert interpreter(str(tmp_path / "missing")) == "python3"


def _ray_job(head: tuple[str, int], worker: tuple[str, int], asked: str) -> Job:
    ranks = tuple(
        JobRank(i, f"n{i}", (0,), (f"GPU-{i}",), state=state, exit_code=code)
        for i, (state, code) in enumerate((head, worker))
    )
    return Job(
        id="j-1", name="tune", user="ann", argv=("python",), state="running",
        submitted=0.0, time_limit_s=60, ranks=ranks, ray=True, stop_requested=asked,
    )  # fmt: skip


def test_a_ray_jobs_end_is_its_heads_once_the_others_were_stopped_for_it() -> None:
    assert _job_outcome(_ray_job(("succeeded", 0), ("killed", 137), RAY_HEAD_ENDED)) == (
        "succeeded",
        0,
    )
    failed = _job_outcome(_ray_job(("failed", 3), ("killed", 137), "rank 0 failed"))
    assert failed == ("failed", 3)
    killed = _job_outcome(_ray_job(("killed", 143), ("killed", 143), "kill"))
    assert killed[0] == "killed"  # gpuclaim kill: killed, whatever the head said
    worker_failed = _job_outcome(_ray_job(("killed", 143), ("failed", 1), "rank 1 failed"))
    assert worker_failed == ("failed", 1)  # a worker that could not join fails the job


def test_a_ray_jobs_sbatch_script_runs_ray_symmetric_run_on_every_node() -> None:
    from gpuclaim.app.slurm.sbatch import render_sbatch

    job = _ray_job(("succeeded", 0), ("killed", 137), RAY_HEAD_ENDED).with_(
        argv=("python", "tune.py", "--trials", "8"), gpus_per_node=2, nodes_wanted=2, ray_cpus=4
    )
    script = render_sbatch(job, "h100")
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gres=gpu:h100:2" in script
    assert 'srun --ntasks-per-node=1 ray symmetric-run --address "$head_addr:$ray_port"' in script
    assert (
        '--min-nodes "$SLURM_JOB_NUM_NODES" --num-gpus=2 --num-cpus=4 -- python tune.py --trials 8'
        in script
    )
    assert "torch.distributed.run" not in script  # not a torch gang
