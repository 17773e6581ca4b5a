"""Pure parsers for what ``nvidia-smi`` prints: CSV queries, ``-L`` and ``-q -x``.

No I/O here: callers run the tool (locally, over SSH, or the simulator in
``gpuclaim.sim.fake_nvidia_smi``) and hand the text in.

Contract shared by every parser:

* memory is returned in MiB (``int``), utilization in percent (``int``);
* a value nvidia-smi cannot give (``[N/A]``, ``N/A``, ``[Not Supported]``,
  ``[Unknown Error]``, ``[Requested functionality has been deprecated]``, any
  other ``[...]`` marker, or an empty cell) becomes ``None``;
* blank input means "no GPUs / no processes" and gives an empty list;
* input that is not the expected nvidia-smi output (no known column in the
  header, a row with the wrong number of cells, a number that does not parse,
  malformed XML) raises ``ValueError`` and nothing else, so callers need one
  ``except``.  Check :func:`looks_like_no_driver` first to tell a node without a
  working driver from garbage.

A :class:`~gpuclaim.core.model.Gpu` whose ``uuid`` is ``""`` came from a sample that
did not include the ``uuid`` column (e.g. a query for memory/utilization only).
Callers must treat such a GPU as unusable for claims: claims are keyed by UUID.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Optional

from gpuclaim.core.inventory import Gpu, GpuProcess

if TYPE_CHECKING:  # the XML parser is imported by what reads XML: a look reads CSV
    import xml.etree.ElementTree as ET

GPU_QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "mig.mode.current",
    "driver_version",
)
APP_QUERY_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")

DRIVER_MISSING_MARKERS = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    "No devices were found",
    # A driver upgraded without a reboot: the kernel module and NVML disagree.
    "Driver/library version mismatch",
)

# nvidia-smi accepts aliases for some fields but always prints the canonical name
# in the header ("--query-compute-apps=name,pid" prints "process_name, pid").
_GPU_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
_APP_ALIASES = {"used_memory": "used_gpu_memory", "name": "process_name"}

_UNIT_HEADER = re.compile(r"^(?P<name>.*?)\s*\[[^\]]*\]$")
_NUMBER = re.compile(r"^(?P<num>-?\d+(?:\.\d+)?)\s*(?P<unit>[A-Za-z%]*)$")
_LIST_GPU = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*) \(UUID: (?P<uuid>[^)]+)\)$")
_LIST_MIG = re.compile(
    r"^MIG (?P<profile>.+?)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>[^)]+)\)$"
)


def looks_like_no_driver(stderr_or_stdout: str) -> bool:
    """True when nvidia-smi's output says the node has no usable driver or no GPU."""
    text = (stderr_or_stdout or "").lower()
    return any(marker.lower() in text for marker in DRIVER_MISSING_MARKERS)


def parse_query_gpu(text: str, node: str, fields: Optional[Sequence[str]] = None) -> list[Gpu]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    ``fields`` is the list that was asked for when the output has no header; when it
    is None the first line is the header (with or without ``[unit]`` suffixes).
    Columns are found by name, so the order and any extra columns do not matter.
    A missing ``index`` column defaults to the row number, a missing ``name`` or
    ``uuid`` to ``""`` (see the module docstring).
    """
    rows = _read_table(text, fields, _GPU_ALIASES, set(_GPU_KNOWN))
    gpus = []
    for row_no, row in enumerate(rows):
        index = _int(row.get("index"), "index", ("",))
        gpus.append(
            Gpu(
                node=node,
                index=row_no if index is None else index,
                uuid=row.get("uuid") or "",
                name=row.get("name") or "",
                memory_total_mib=_mib(row.get("memory.total"), "memory.total"),
                memory_used_mib=_mib(row.get("memory.used"), "memory.used"),
                utilization_pct=_int(row.get("utilization.gpu"), "utilization.gpu", ("%", "")),
                pci_bus_id=row.get("pci.bus_id"),
                mig_mode=_mig_mode(row.get("mig.mode.current")),
            )
        )
    return gpus


def parse_driver_version(text: str, fields: Optional[Sequence[str]] = None) -> Optional[str]:
    """The ``driver_version`` column of the same ``--query-gpu`` output, or None if absent."""
    rows = _read_table(text, fields, _GPU_ALIASES, set(_GPU_KNOWN))
    for row in rows:
        if row.get("driver_version"):
            return row["driver_version"]
    return None


def parse_compute_apps(text: str, fields: Optional[Sequence[str]] = None) -> list[GpuProcess]:
    """Parse ``nvidia-smi --query-compute-apps=... --format=csv[,noheader][,nounits]``.

    ``used_gpu_memory`` (alias ``used_memory``) is None where the driver does not
    know it (Windows WDDM prints ``[N/A]``).  Process names are kept verbatim,
    spaces and backslashes included.
    """
    rows = _read_table(text, fields, _APP_ALIASES, set(_APP_KNOWN), merge_into="process_name")
    procs = []
    for row in rows:
        pid = _int(row.get("pid"), "pid", ("",))
        if pid is None:
            raise ValueError("compute-apps output without a pid column or value")
        procs.append(
            GpuProcess(
                pid=pid,
                name=row.get("process_name") or "",
                used_memory_mib=_mib(row.get("used_gpu_memory"), "used_gpu_memory"),
                gpu_uuid=row.get("gpu_uuid"),
            )
        )
    return procs


def attach_processes(gpus: list[Gpu], procs: list[GpuProcess]) -> list[Gpu]:
    """Give each GPU the processes whose ``gpu_uuid`` is its UUID (or one of its MIG UUIDs).

    nvidia-smi reports processes on a MIG instance with the parent GPU's UUID, so
    that is the normal match; the MIG-UUID match is for tools that report children.
    A GPU with an empty UUID gets no processes.  The result replaces ``processes``.
    """
    out = []
    for gpu in gpus:
        keys = ({gpu.uuid, *gpu.mig_devices} - {""}) if gpu.uuid else set()
        mine = tuple(p for p in procs if p.gpu_uuid and p.gpu_uuid in keys)
        out.append(gpu.replace(processes=mine))
    return out


def parse_list_gpus(text: str) -> list[tuple[int, str, str, list[str]]]:
    """Parse ``nvidia-smi -L``: ``(index, name, uuid, [MIG child UUIDs])`` per GPU."""
    gpus: list[tuple[int, str, str, list[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _LIST_GPU.match(line)
        if m:
            gpus.append((int(m["index"]), m["name"], m["uuid"].strip(), []))
            continue
        m = _LIST_MIG.match(line)
        if m and gpus:
            gpus[-1][3].append(m["uuid"].strip())
            continue
        raise ValueError(f"not an nvidia-smi -L line: {raw!r}")
    return gpus


def attach_mig_devices(
    gpus: list[Gpu], listing: list[tuple[int, str, str, list[str]]]
) -> list[Gpu]:
    """Fill ``mig_devices`` from :func:`parse_list_gpus` output, matching by UUID."""
    children = {uuid: tuple(migs) for _, _, uuid, migs in listing}
    return [g.replace(mig_devices=children.get(g.uuid, g.mig_devices)) for g in gpus]


def parse_query_xml(text: str, node: str) -> tuple[list[Gpu], Optional[str]]:
    """Parse ``nvidia-smi -q -x`` (DTD v11..v13): the GPUs and the driver version.

    ``minor_number`` is the /dev/nvidiaN number, not the index: the index is the
    position in the file (nvidia-smi lists GPUs in PCI bus order).  MIG instances
    are recorded as their UUID when the XML has one, else as ``"GI <gi>/CI <ci>"``.
    """
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"not nvidia-smi XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not nvidia-smi XML: root element is <{root.tag}>")
    driver = _na(root.findtext("driver_version"))
    gpus = []
    for index, el in enumerate(root.findall("gpu")):
        uuid = _na(el.findtext("uuid")) or ""
        procs = tuple(
            GpuProcess(
                pid=_require_int(p.findtext("pid"), "pid"),
                name=_na(p.findtext("process_name")) or "",
                used_memory_mib=_mib(_na(p.findtext("used_memory")), "used_memory"),
                gpu_uuid=uuid or None,
                kind=_na(p.findtext("type")) or "C",
            )
            for p in el.findall("processes/process_info")
        )
        gpus.append(
            Gpu(
                node=node,
                index=index,
                uuid=uuid,
                name=_na(el.findtext("product_name")) or "",
                memory_total_mib=_mib(_na(el.findtext("fb_memory_usage/total")), "total"),
                memory_used_mib=_mib(_na(el.findtext("fb_memory_usage/used")), "used"),
                utilization_pct=_int(
                    _na(el.findtext("utilization/gpu_util")), "gpu_util", ("%", "")
                ),
                pci_bus_id=_na(el.findtext("pci/pci_bus_id")) or _na(el.get("id")),
                mig_mode=_mig_mode(_na(el.findtext("mig_mode/current_mig"))),
                mig_devices=tuple(_mig_label(m) for m in el.findall("mig_devices/mig_device")),
                processes=procs,
            )
        )
    return gpus, driver


# --- internals -------------------------------------------------------------------------

_GPU_KNOWN = (
    *GPU_QUERY_FIELDS,
    "memory.free",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "count",
    "timestamp",
)
_APP_KNOWN = (*APP_QUERY_FIELDS, "timestamp", "gpu_name", "gpu_bus_id", "gpu_serial")


def _na(value: Optional[str]) -> Optional[str]:
    """Strip a cell; nvidia-smi's "no value" markers (and empty) become None."""
    if value is None:
        return None
    value = value.strip()
    if not value or value == "N/A" or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def _read_table(
    text: str,
    fields: Optional[Sequence[str]],
    aliases: dict[str, str],
    known: set[str],
    merge_into: Optional[str] = None,
) -> list[dict[str, Optional[str]]]:
    """CSV text -> one dict per row, keyed by canonical field name (units stripped).

    nvidia-smi never quotes, so quoting is off: a ``"`` in a process name stays.
    If a row has more cells than the header and ``merge_into`` is a column, the
    surplus is taken to be commas inside that value and is glued back with ", ".
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    import csv  # here: the first look reads XML (remote.shell_look), only a CSV reader needs it

    reader = csv.reader(lines, skipinitialspace=True, quoting=csv.QUOTE_NONE)
    try:
        table = [[cell.strip() for cell in row] for row in reader]
    except csv.Error as exc:
        raise ValueError(f"not nvidia-smi CSV: {exc}") from None
    if fields is None:
        header, body = table[0], table[1:]
        names = [_header_name(h) for h in header]
    else:
        body = table
        names = [f.strip() for f in fields]
    names = [aliases.get(n, n) for n in names]
    if not known.intersection(names):
        raise ValueError(f"no known nvidia-smi column in {names[:8]!r}")
    rows = []
    for cells in body:
        if len(cells) > len(names) and merge_into in names:
            at = names.index(merge_into)
            extra = len(cells) - len(names)
            cells = [*cells[:at], ", ".join(cells[at : at + extra + 1]), *cells[at + extra + 1 :]]
        if len(cells) != len(names):
            raise ValueError(f"row has {len(cells)} cells, header has {len(names)}: {cells[:4]!r}")
        rows.append({n: _na(c) for n, c in zip(names, cells)})
    return rows


def _header_name(header: str) -> str:
    m = _UNIT_HEADER.match(header.strip())
    return (m["name"] if m else header).strip()


def _number(value: str, what: str, units: Iterable[str]) -> float:
    m = _NUMBER.match(value.strip())
    if not m or m["unit"] not in units:
        raise ValueError(f"{what}: not a number in {tuple(units)!r}: {value!r}")
    return float(m["num"])


def _int(value: Optional[str], what: str, units: Iterable[str]) -> Optional[int]:
    if value is None:
        return None
    return round(_number(value, what, units))


def _require_int(value: Optional[str], what: str) -> int:
    number = _int(_na(value), what, ("",))
    if number is None:
        raise ValueError(f"{what} missing")
    return number


def _mib(value: Optional[str], what: str) -> Optional[int]:
    return _int(value, what, ("MiB", ""))


def _mig_mode(value: Optional[str]) -> Optional[bool]:
    if value is None:
        return None
    return {"enabled": True, "disabled": False}.get(value.lower())


def _mig_label(mig: ET.Element) -> str:
    uuid = _na(mig.findtext("uuid"))
    if uuid:
        return uuid
    gi = _na(mig.findtext("gpu_instance_id"))
    ci = _na(mig.findtext("compute_instance_id"))
    return f"GI {gi}/CI {ci}" if ci is not None else f"GI {gi}"
