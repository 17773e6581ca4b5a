"""GPU type names: the short ``Type=`` a GPU gets in slurm.conf and gres.conf (``h100``,
``l40s``, ``rtx_4090``), chosen so that slurmd's AutoDetect=nvml accepts it, the name
AutoDetect=nvml itself reports for a product name, and the type of a MIG slice (``3g.40gb``).
Pure string work, shared by the node descriptions and every renderer.
"""

from __future__ import annotations

import re

# slurmd's AutoDetect=nvml names a GPU type by its product name, lowercased, spaces as "_"
# ("NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3"), and accepts a configured Type only if
# it is a case-insensitive substring of that. So each type below is the text its pattern
# matched in that name: a substring by construction. First match wins. Some short names are
# also substrings of a longer model's name ("a10" of every "a100", "l40" of "l40s"), which no
# name shorter than the full one avoids; slurmd tries the longest configured type first and
# gives each configured GPU to one detected GPU, so a node with both still comes out right
# (tests/test_slurm_real.py runs one).
GPU_TYPE_PATTERNS: tuple[str, ...] = (
    r"rtx_pro_\d{4}",  # RTX PRO 6000 Blackwell (Server / Workstation Edition)
    r"quadro_rtx_\d{4}",  # Quadro RTX 6000: not the RTX 6000 Ada
    r"rtx_\d{4}(?:_sff)?_ada",  # RTX 6000 Ada Generation, RTX 4000 SFF Ada Generation
    r"rtx_a\d{3,4}",  # RTX A6000, A5000, A4000 ...
    r"titan_[a-z]+",  # TITAN RTX, TITAN V, TITAN Xp
    r"[rg]tx_\d{4}(?:_ti|_super|_d)*",  # GeForce RTX 4090, RTX 2080 SUPER, GTX 1080 Ti
    r"g[hb]\d{2,3}",  # Grace superchips GH200, GB200, and GB10 (DGX Spark)
    r"(?<![a-z])[abh]\d00",  # A100, A800, B200, H100, H200, H800
    r"(?<![a-z])h20(?!\d)",  # H20
    r"(?<![a-z])v100s?",  # V100, V100S
    r"(?<![a-z])[aklmpt]\d{1,2}[gs]?(?![0-9])",  # L40S, L40, L4, A40, A30, A10G, A10, T4, P40
)
_TYPE_RES = tuple(re.compile(p) for p in GPU_TYPE_PATTERNS)
_SAFE_TYPE = re.compile(r"^[a-z][a-z0-9_.-]{0,39}$")
_VENDOR_PREFIX = re.compile(r"^(?:nvidia_|tesla_|geforce_|quadro_)+")
_SPEC_SUFFIX = re.compile(r"[-_](?:\d+gb|pcie|sxm\d*|nvl|hbm\w*|laptop|mig|\(.*).*$")


def autodetect_type(product_name: str) -> str:
    """The GPU type slurmd's AutoDetect=nvml reports for this product name."""
    return product_name.lower().replace(" ", "_")


_MIG_PROFILE = re.compile(r"^(?:\d+c\.)?(?P<slices>\d+)g\.(?P<gb>\d+)gb")


def mig_autodetect_type(product_name: str, slices: int, memory_mib: int) -> str:
    """The type AutoDetect=nvml gives a MIG slice: its GPU's name up to the first "-", then
    ``_<slices>g.<GiB>gb`` with its memory rounded to whole GiB (slurm's gpu_nvml.c), as
    ``nvidia_a100_3g.20gb`` or ``nvidia_h100_80gb_hbm3_3g.40gb``."""
    gib = int(memory_mib / 1024 + 0.5)  # C's roundl: halves away from zero
    return autodetect_type(product_name.strip().split("-", 1)[0]) + f"_{slices}g.{gib}gb"


def mig_type_name(product_name: str, profile: str, memory_mib: int = 0) -> str:
    """A MIG slice's type for slurm.conf and gres.conf: the ``<slices>g.<GiB>gb`` end of what
    AutoDetect=nvml names it (a substring of that name, as a Type must be), which is
    ``--mig``'s profile wherever the memory rounds to the profile's GiB (``3g.40gb``). ""
    for a profile that does not parse."""
    m = _MIG_PROFILE.match(profile.strip().lower())
    if m is None:
        return ""
    slices = int(m["slices"])
    if not memory_mib:
        return f"{slices}g.{int(m['gb'])}gb"
    return mig_autodetect_type(product_name, slices, memory_mib).rsplit("_", 1)[-1]


def slurm_type_name(product_name: str) -> str:
    """A short GPU type for slurm.conf and gres.conf that AutoDetect=nvml accepts: ``h100``,
    ``l40s``, ``rtx_4090``. Unknown models get their name without vendor prefix and memory
    suffix; "" (an untyped GPU, always safe) when nothing usable is left."""
    detected = autodetect_type(product_name.strip())
    for pattern in _TYPE_RES:
        m = pattern.search(detected)
        if m:
            return m.group(0)
    rest = _SPEC_SUFFIX.sub("", _VENDOR_PREFIX.sub("", detected))
    if _SAFE_TYPE.match(rest) and rest in detected:
        return rest
    return ""
