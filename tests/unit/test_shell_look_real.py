"""A shell look's output as a real node printed it (remote/shell_look.py): one NVIDIA H200,
driver 580.159.04, persistence mode on, no agent installed yet (captured on a lent device,
session 28; tests/fixtures/shell-look/). The laptop reads it to the inventory the agent's own
probe gives, with the node's boot id and the look's start for liveness."""

from __future__ import annotations

from pathlib import Path

from gpuclaim.remote.shell_look import parse_look

RAW = Path(__file__).parents[1] / "fixtures" / "shell-look" / "h200_drv580.159.04_agent-missing.txt"
REQUEST = {"op": "probe", "node": "h200", "nvidia_smi": [], "env": {}, "timeout": 10}


def test_a_real_h200_look_reads_to_the_agents_inventory() -> None:
    look = parse_look(RAW.read_bytes(), b"", REQUEST)
    assert look is not None
    assert (look.agent, look.socket, look.cannot) == ("missing", "", "")
    inv = look.inventory
    assert inv is not None
    assert (inv["node"], inv["source"], inv["driver_version"], inv["error"]) == (
        "h200",
        "nvidia-smi",
        "580.159.04",
        None,
    )
    (gpu,) = inv["gpus"]
    assert (gpu["index"], gpu["uuid"], gpu["name"]) == (
        0,
        "GPU-1adb0499-40e8-665f-2120-02715a8c4436",
        "NVIDIA H200",
    )
    assert (gpu["memory_total_mib"], gpu["memory_used_mib"], gpu["processes"]) == (143771, 0, [])
    assert inv["liveness"] == {
        "boot_id": "8764910e-a5ae-49c5-aa60-9b998c6fb95f",
        "checked_from": 2909,  # field 22 of the look's own /proc/self/stat
        "wrappers": [],
    }


def test_a_real_look_cut_short_is_not_taken_for_one() -> None:
    whole = RAW.read_bytes()
    assert parse_look(whole[: whole.index(b"@owners")], b"", REQUEST) is None
