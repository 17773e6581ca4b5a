"""[share] export slurm of MIG slices, as slurmd's AutoDetect=nvml types them: each slice a GPU
GRES typed by its profile (``gpu:3g.40gb:1``), no File= line of its own (its device files
are /dev/nvidia-caps entries made with the slice), partitions by the GPU's model, and the
sbatch script of a ``--mig`` job asking for its slice's type."""

from __future__ import annotations

from gpuclaim.app.slurm import (
    ExportOptions,
    GpuSlot,
    NodeSpec,
    plan_partitions,
    render_gres_conf,
    render_migration_md,
    render_slurm_conf,
)
from gpuclaim.app.slurm.gputypes import mig_autodetect_type, mig_type_name
from gpuclaim.app.slurm.sbatch import job_gpu_type, render_sbatch
from gpuclaim.app.slurm.spec import partition_for
from gpuclaim.core.model import Job, JobRank

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def _slice(index: int, profile: str, mib: int, n: int, name: str = H100) -> GpuSlot:
    return GpuSlot(
        index, name, index, mig=True, uuid=f"MIG-{index}-{n}", mig_profile=profile, memory_mib=mib
    )


def _mig_node() -> NodeSpec:
    """Fixture 05's H100 in MIG mode (GPU 0) beside a whole H100 (GPU 1)."""
    slots = (
        _slice(0, "3g.40gb", 40448, 0),
        _slice(0, "2g.20gb", 20096, 1),
        _slice(0, "1g.10gb", 9984, 2),
        _slice(0, "1g.10gb", 9984, 3),
        GpuSlot(1, H100, 1, uuid="GPU-1"),
    )
    return NodeSpec("node01", "gpu01", 64, 2, 16, 2, 500_000, slots)


def test_a_slice_is_typed_as_autodetect_nvml_names_it():
    # gpu_nvml.c: the name up to its first "-", then _<slices>g.<MiB/1024 rounded>gb
    assert mig_autodetect_type(A100, 3, 40192) == "nvidia_a100_3g.39gb"
    assert mig_autodetect_type(H100, 3, 40448) == "nvidia_h100_80gb_hbm3_3g.40gb"
    assert mig_autodetect_type(A100, 1, 9728) == "nvidia_a100_1g.10gb"  # 9.5 rounds up
    # the type written is the end of that name: a substring, as slurmd requires
    for name, profile, mib in [(A100, "3g.40gb", 40192), (H100, "1g.10gb", 9984)]:
        typed = mig_type_name(name, profile, mib)
        assert typed and typed in mig_autodetect_type(name, int(profile[0]), mib)
    assert mig_type_name(H100, "3g.40gb", 40448) == "3g.40gb"  # the profile, as a rule
    assert mig_type_name(A100, "7g.80gb", 81152) == "7g.79gb"  # slurmd's rounding wins
    assert mig_type_name(H100, "1c.3g.40gb") == "3g.40gb"  # a compute instance: its GI's
    assert mig_type_name(H100, "3g.40gb") == "3g.40gb"  # memory unknown: the profile's
    assert mig_type_name(H100, "slice") == ""  # unparsed: untyped, always accepted


def test_slurm_conf_counts_slices_as_gpus_of_their_own_and_never_the_parent():
    conf = render_slurm_conf([_mig_node()], ExportOptions("lab"))
    line = next(x for x in conf.splitlines() if x.startswith("NodeName=gpu01"))
    assert "Gres=gpu:3g.40gb:1,gpu:2g.20gb:1,gpu:1g.10gb:2,gpu:h100:1 " in line, line
    # one partition for the H100s, the slices in it too: not one per profile
    parts = plan_partitions([_mig_node()])
    assert [(p.name, p.gpu_type, p.nodes) for p in parts] == [("gpu", "h100", ("gpu01",))]
    assert partition_for([_mig_node()], "node01", "1g.10gb") == "gpu"


def test_gres_conf_writes_files_for_whole_gpus_and_leaves_slices_to_autodetect():
    gres = render_gres_conf([_mig_node()])
    lines = [x for x in gres.splitlines() if not x.startswith("#")]
    assert lines == ["AutoDetect=nvml", "NodeName=gpu01 Name=gpu Type=h100 File=/dev/nvidia1"]
    notes = " ".join(x for x in gres.splitlines() if x.startswith("#"))
    assert "1 3g.40gb, 1 2g.20gb, 2 1g.10gb" in notes and "slurmd -G" in notes
    assert "built with NVML" in notes
    # shards are of whole GPUs only: a slice has no File= for them
    sharded = render_gres_conf([_mig_node()], shards_per_gpu=4)
    shard_lines = [x for x in sharded.splitlines() if "Name=shard" in x]
    assert shard_lines == ["NodeName=gpu01 Name=shard Type=h100 Count=4 File=/dev/nvidia1"]
    conf = render_slurm_conf([_mig_node()], ExportOptions("lab", shards_per_gpu=4))
    assert "shard:h100:4" in conf and "shard:3g" not in conf


def test_a_node_without_slices_has_no_mig_note():
    whole = NodeSpec("n2", "n2", 8, gpus=(GpuSlot(0, H100, 0),))
    assert "MIG" not in render_gres_conf([whole])
    assert "## MIG slices" not in render_migration_md([whole], ExportOptions("lab"))


def test_migration_md_maps_run_mig_to_a_gres_request():
    text = render_migration_md([_mig_node()], ExportOptions("lab"))
    section = text.split("## MIG slices", 1)[1].split("\n## ", 1)[0]
    assert "`gpuclaim run --mig\n3g.40gb` becomes `--gres=gpu:3g.40gb:1`" in section, section
    for t in ("3g.40gb", "2g.20gb", "1g.10gb"):
        assert f"| `{t}` | gpu01 |" in section


def test_a_mig_jobs_script_asks_for_its_slices_type():
    node = _mig_node()
    ran = JobRank(0, "node01", (0,), ("MIG-0-2",))
    job = Job(
        id="j-1",
        name="m1",
        user="ann",
        argv=("python3", "eval.py"),
        state="succeeded",
        submitted=1_700_000_000.0,
        time_limit_s=3600,
        mig="1g.10gb",
        ranks=(ran,),
    )
    gpu_type = job_gpu_type([node], job)
    assert gpu_type == "1g.10gb"
    script = render_sbatch(job, gpu_type, partition_for([node], "node01", gpu_type))
    assert "#SBATCH --gres=gpu:1g.10gb:1" in script
    assert "#SBATCH --partition=gpu" in script
    # one that never ran asks for its profile's slices; a whole-GPU job never for a slice
    queued = job.with_(state="queued", ranks=(), mig="2g.20gb")
    assert job_gpu_type([node], queued) == "2g.20gb"
    assert job_gpu_type([node], job.with_(ranks=(), mig=None)) == "h100"
