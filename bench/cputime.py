"""CPU time of the whole machine, for figures that must count the testbed's nodes too."""

from __future__ import annotations

import os
from pathlib import Path


def machine_cpu() -> float:
    """CPU seconds every process on this machine has used so far (not idle, not iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
