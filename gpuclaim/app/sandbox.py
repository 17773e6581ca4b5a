"""The demo sandbox: simulated GPUs on local nodes, so everything can be tried without GPUs."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from gpuclaim.app.configfile import render_config
from gpuclaim.store import ClaimStore

# Pids above the kernel's pid_max (4194304) never exist, so no real process is mistaken for
# the simulated colleague's training run.
_FOREIGN_PID = 4_194_400

DEMO_STATE: dict[str, Any] = {
    "driver_version": "550.54.15",
    "nodes": {
        "demo01": {
            "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559} for _ in range(4)]
        },
        "demo02": {
            "gpus": [
                {"name": "NVIDIA L40S", "memory_total_mib": 46068},
                {"name": "NVIDIA L40S", "memory_total_mib": 46068},
                {
                    "name": "NVIDIA L40S",
                    "memory_total_mib": 46068,
                    "memory_used_mib": 18000,
                    "utilization_pct": 97,
                    "processes": [
                        {"pid": _FOREIGN_PID, "name": "python", "used_memory_mib": 18000}
                    ],
                },
                {"name": "NVIDIA L40S", "memory_total_mib": 46068},
            ]
        },
    },
}


def create_sandbox(directory: Path, reset: bool = False) -> Path:
    """Write (or reuse) a sandbox in ``directory``; returns its config path."""
    config_path = directory / "config.toml"
    if reset and directory.exists():
        shutil.rmtree(directory)
    if config_path.exists():
        return config_path
    directory.mkdir(parents=True, exist_ok=True)
    state_path = directory / "gpus.json"
    state_path.write_text(json.dumps(DEMO_STATE, indent=2) + "\n", encoding="utf-8")
    fake_smi = [sys.executable, "-m", "gpuclaim.sim.fake_nvidia_smi"]
    node_settings = {
        name: {
            "host": "localhost",
            "transport": "local",
            "nvidia_smi": fake_smi,
            "env": {"GPUCLAIM_NODE": name, "GPUCLAIM_SIM_STATE": str(state_path)},
        }
        for name in DEMO_STATE["nodes"]
    }
    text = render_config(
        cluster="demo",
        nodes=list(DEMO_STATE["nodes"]),
        storage=str(directory / "store"),
        node_settings=node_settings,
        header=(
            "gpuclaim demo sandbox: two local nodes with simulated GPUs.\n"
            f"Simulated GPU state: {state_path} (edit it to change what the GPUs do).\n"
            "Delete this directory, or run 'gpuclaim demo --reset', to start over."
        ),
    )
    config_path.write_text(text, encoding="utf-8")
    ClaimStore(directory / "store").ensure(create=True)
    return config_path
