"""MIG slices read from real nvidia-smi output (fixtures 05 and 08): ``-L`` names the slices,
``-q -x`` gives their memory and instances; a GPU in MIG mode becomes its slices."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuclaim.core.errors import ProbeError
from gpuclaim.node.probe.mig import parse_listed_slices, profile_in
from gpuclaim.node.probe.smi import inventory_from_xml

SMI = Path(__file__).parent.parent / "fixtures" / "nvidia-smi"
H100_L = SMI / "05_h100-mig_drv590.48.01_list-gpus_L.txt"
A100_XML = SMI / "08_a100-sxm4-80gb-mig_drv535.54.03_q-x_v12.xml"


def test_the_real_listing_names_each_slice_of_its_gpu():
    listed = parse_listed_slices(H100_L.read_text())
    ((parent, slices),) = listed.items()
    assert parent == "GPU-00000000-0000-0000-0000-000000000000"
    assert [slices[n][0] for n in range(4)] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert slices[3][1] == "MIG-00000003-0000-0000-0000-000000000003"


def _a100_listing(xml: str) -> str:
    """The -L an A100 of fixture 08 would print: its UUID, four 1g.20gb-sized slices."""
    uuid = xml.split("<uuid>", 1)[1].split("</uuid>", 1)[0]
    lines = [f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {uuid})"]
    lines += [f"  MIG 2g.20gb     Device  {n}: (UUID: MIG-a100-{n})" for n in range(4)]
    return "\n".join(lines)


def test_a_real_mig_gpu_is_its_slices_with_their_memory_and_never_whole():
    xml = A100_XML.read_text()
    inv = inventory_from_xml("n", xml, lambda pid: None, _a100_listing(xml))
    gpus = list(inv.gpus)
    assert [g.label for g in gpus] == ["0/0", "0/1", "0/2", "0/3"]
    assert {g.memory_total_mib for g in gpus} == {19968}  # each mig_device's fb_memory total
    assert all(g.uuid.startswith("MIG-a100-") and not g.mig_parent for g in gpus)
    assert {g.parent_uuid for g in gpus} == {xml.split("<uuid>", 1)[1].split("</uuid>", 1)[0]}
    # without -L nobody could be pinned to a slice: none is offered, nor the GPU whole
    assert inventory_from_xml("n", xml, lambda pid: None, None).gpus == ()


def test_a_slice_memory_that_is_not_a_number_is_a_probe_error_not_a_traceback():
    xml = A100_XML.read_text().replace("<total>19968 MiB</total>", "<total>lots</total>", 1)
    with pytest.raises(ProbeError, match="unexpected nvidia-smi output"):
        inventory_from_xml("n", xml, lambda pid: None, _a100_listing(xml))


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "3g.40gb"),
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb+me", "1g.10gb+me"),
        ("MIG 1c.3g.40gb Device 0", "1c.3g.40gb"),
    ],
)
def test_nvml_slice_names_give_their_profile(name, profile):
    assert profile_in(name) == profile
