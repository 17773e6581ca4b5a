"""A look at a node that starts no Python there: one ``sh`` command over SSH.

A node with no warm agent yet (the first call of the day, a node just added) used to answer
its first look from a Python agent started for it: tens of milliseconds of interpreter
start and imports per node before ``nvidia-smi`` even ran, on the critical path of the
first ``status``. This look is what pdsh would run: ``nvidia-smi -q -x`` and a few reads of
``/proc`` (boot id, the job wrappers alive, who owns the GPU processes), printed in marked
sections and parsed here with the agent's own parsers (``node.probe.smi``,
``node.liveness``), so the answer is the one the agent would give.

The same command looks after the warm agent, off the critical path: it says whether one
runs (the where-file its server writes: ``node.server.where_file``), starts an installed
one in the background after the look's last line, or says none is installed (the caller
then installs it in the background: ``WarmAgents``). A node whose ``nvidia-smi`` is not on
the PATH (NVML only) says so, and the Python agent answers instead.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from gpuclaim.core.errors import ProbeError
from gpuclaim.core.inventory import NodeInventory
from gpuclaim.core.liveness import start_in_stat
from gpuclaim.node.home import BOOT
from gpuclaim.node.liveness import is_wrapper_argv, processes_hidden_in

HEADER = "@gpuclaim-look 1"
TIMED_OUT = (124, 137)  # timeout(1): the time ran out; 137: it had to kill after -k

# Sections, in the order printed. What is between two markers is the section's text.
_SCRIPT = r"""
exec 3>&2 2>/dev/null  # only nvidia-smi's complaints reach the caller
a="$HOME/.cache/gpuclaim/agent-{version}"
echo '{header}'
s=missing
if [ -e "$a.pyz" ] || [ -e "$a" ]; then s=starting; fi
p=; w=; t=; h=localhost
read -r h < /proc/sys/kernel/hostname  # one where-file per host: a home NFS shares
if [ -r "$a@$h.where" ]; then {{ read -r p; read -r w; read -r t; }} < "$a@$h.where"; fi
# warm: its socket is there and ours, and its pid is still that process (the start time
# it wrote is field 22 of its stat): not another of ours that took a dead agent's pid
if [ -n "$w" ] && [ -n "$t" ] && [ -S "$w" ] && [ -O "$w" ] && read -r b < "/proc/$p/stat"; then
  b=${{b##*)}}; set -- $b; shift 19; if [ "$1" = "$t" ]; then s=warm; fi
fi
if [ $s = missing ] && ! e=$(mkdir -p "$HOME/.cache/gpuclaim" 2>&1); then
  s=cannot; echo "@cannot $e"
fi
echo "@agent $s"
echo "@socket $w"
echo @boot; read -r b < /proc/sys/kernel/random/boot_id; echo "$b"
echo @self; read -r b < /proc/$$/stat; echo "$b"
echo @mounts
while read -r b; do case $b in *' - proc '*) printf '%s\n' "$b";; esac; done < /proc/self/mountinfo
echo @wrappers
# [.]: the pattern is not in its own text, so this script, its grep and other looks'
# scripts (all with it in their command lines) are not found: only wrappers pay a `tr`
for f in $(grep -l -a -e '/spec[.]json' /proc/[0-9]*/cmdline 2>/dev/null); do
  d=${{f%/cmdline}}; echo "@w ${{d#/proc/}}"
  printf 'c '; tr '\000\n' '\037\036' < "$f"; echo
  b=; read -r b < "$d/stat"; echo "s $b"
done
{smi}
t=; if command -v timeout >/dev/null 2>&1; then t="timeout -k 2 {timeout}"; fi
echo @smi
o=$({env}$t "$@" -q -x 2>&3); c=$?
printf '%s\n' "$o"
echo "@smi-exit $c"
case $o in *'<current_mig>Enabled'*)  # MIG slices' UUIDs: only -L says them (no user text)
  echo @list; {env}$t "$@" -L 2>&3; echo "@list-exit $?";;
esac
echo @owners
case $o in *'<pid>'*)
  q=$(printf '%s\n' "$o" | sed -n 's:.*<pid>\([0-9][0-9]*\)</pid>.*:/proc/\1:p')
  if [ -n "$q" ]; then stat -c '%u %U %n' $q; fi;;
esac
echo @end
if [ $s = starting ]; then
  for x in "$a.pyz" "$a"; do
    if [ -e "$x" ]; then
      python3 -c {boot} "$x" serve-detached {version} {idle} </dev/null >/dev/null 2>&1 3>&- &
      break
    fi
  done
fi
"""

# Which nvidia-smi: the configured command, else the one on the PATH, else none (NVML only:
# the Python agent answers that node).
_SMI_ON_PATH = (
    "if command -v nvidia-smi >/dev/null 2>&1; then set -- nvidia-smi; "
    "else echo @no-smi; echo @end; exit 0; fi"
)


@dataclass(frozen=True)
class ShellLook:
    """What a shell look found: the inventory as the agent's ``probe`` gives it (None: this
    node's GPUs need the Python agent), and the warm agent's state: ``warm`` (its socket in
    ``socket``), ``starting`` (started by this look), ``missing`` (not installed),
    ``cannot`` (not installable: ``cannot`` says why)."""

    agent: str
    socket: str
    inventory: Optional[dict[str, Any]]
    cannot: str = ""  # why the agent cannot be installed (~/.cache/gpuclaim unusable)


def look_command(version: str, idle_s: float, request: Mapping[str, Any]) -> str:
    """The command for one ``probe`` request (``core.protocol.ProbeRequest``)."""
    configured = [str(word) for word in request.get("nvidia_smi") or ()]
    smi = f"set -- {shlex.join(configured)}" if configured else _SMI_ON_PATH
    pairs = [shlex.quote(f"{k}={v}") for k, v in dict(request.get("env") or {}).items()]
    env = f"env {' '.join(pairs)} " if pairs else ""  # no process more where none is set
    script = _SCRIPT.format(
        version=shlex.quote(version),
        header=HEADER,
        smi=smi,
        timeout=f"{max(1.0, float(request['timeout'])):g}",
        env=env,
        boot=shlex.quote(BOOT),
        idle=f"{idle_s:g}",
    )
    return f"exec sh -c {shlex.quote(script)}"


def parse_look(stdout: bytes, stderr: bytes, request: Mapping[str, Any]) -> Optional[ShellLook]:
    """What the command printed, read; None if it is not a whole look (a shell that is not
    ``sh``, a cut connection): the Python agent answers instead."""
    text = stdout.decode("utf-8", "replace")
    start = text.find(HEADER + "\n")
    if start < 0:
        return None
    sections = _sections(text[start + len(HEADER) + 1 :])
    if sections is None:
        return None
    agent, socket = sections.pop("agent", ""), sections.pop("socket", "")
    cannot = sections.pop("cannot", "").strip().splitlines()
    if "no-smi" in sections:
        return ShellLook(agent, socket, None, cannot[-1] if cannot else "")
    node = str(request["node"])
    inventory = _inventory(node, sections, stderr.decode("utf-8", "replace"), request)
    return ShellLook(agent, socket, inventory.to_dict(), cannot[-1] if cannot else "")


def _sections(text: str) -> Optional[dict[str, str]]:
    """``@name value`` lines and ``@name`` headed blocks, by name (the wrappers' ``@w`` lines
    stay in their block); None without the ``@end`` line.

    nvidia-smi's output is the one part others on the node control: a process name is
    whatever its owner made it, newlines and ``@`` lines too. So it is never read for
    markers: it is all between the first ``@smi`` line (everything before is the script's
    own) and the last ``@smi-exit`` line (everything after is too). An ``@agent`` or an
    ``@end`` in it is only text of the XML."""
    lines = text.split("\n")
    if "@smi" not in lines:  # no nvidia-smi here (@no-smi): nobody else's text at all
        return _marked(lines, need_end=True)
    first = lines.index("@smi")
    ends = [i for i, line in enumerate(lines) if line.startswith("@smi-exit ")]
    if not ends or ends[-1] < first:
        return None
    before = _marked(lines[:first], need_end=False)
    after = _marked(lines[ends[-1] :], need_end=True)
    if before is None or after is None:
        return None
    return {**before, **after, "smi": "\n".join(lines[first + 1 : ends[-1]])}


def _marked(lines: list[str], need_end: bool) -> Optional[dict[str, str]]:
    found: dict[str, list[str]] = {}
    current: Optional[list[str]] = None
    for line in lines:
        name, _, value = line.partition(" ")
        if name in ("@agent", "@socket", "@smi-exit", "@cannot", "@list-exit"):
            found[name[1:]] = [value]
            current = None
        elif name in ("@boot", "@self", "@mounts", "@wrappers", "@owners", "@no-smi", "@list"):
            current = found.setdefault(name[1:], [])
        elif line == "@end":
            return {key: "\n".join(block) for key, block in found.items()}
        elif current is not None:
            current.append(line)
    if need_end:
        return None
    return {key: "\n".join(block) for key, block in found.items()}


def _inventory(
    node: str, sections: dict[str, str], stderr: str, request: Mapping[str, Any]
) -> NodeInventory:
    try:
        inventory = _gpus(node, sections, stderr, request)
    except ProbeError as exc:
        inventory = NodeInventory(node=node, source="nvidia-smi", error=str(exc))
    return inventory.replace(liveness=_liveness(sections))


def _gpus(
    node: str, sections: dict[str, str], stderr: str, request: Mapping[str, Any]
) -> NodeInventory:
    # here: the XML parser is for nodes with no warm agent, not every look's start
    from gpuclaim.node.probe.smi import check_smi_exit, inventory_from_xml

    stdout = sections.get("smi", "")
    try:
        code = int(sections.get("smi-exit", ""))
    except ValueError:
        code = 1
    command = " ".join(str(w) for w in request.get("nvidia_smi") or ()) or "nvidia-smi"
    if code in TIMED_OUT:
        raise ProbeError(f"nvidia-smi did not answer within {float(request['timeout']):.0f}s")
    if code in (126, 127):
        reason = "Permission denied" if code == 126 else "No such file or directory"
        raise ProbeError(f"cannot run {command}: {reason}")
    check_smi_exit(code, stdout, stderr)
    owners = _owners(sections.get("owners", ""))
    listing = sections.get("list") if sections.get("list-exit", "").strip() == "0" else None
    return inventory_from_xml(node, stdout, owners.get, listing)


def _owners(text: str) -> dict[int, str]:
    """``stat -c '%u %U %n'`` lines: pid -> user name (``uid N`` where it has none, as
    ``node.probe.owners`` says it)."""
    owners = {}
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[2].startswith("/proc/") and parts[2][6:].isdigit():
            uid, name = parts[0], parts[1]
            owners[int(parts[2][6:])] = f"uid{uid}" if name == "UNKNOWN" else name
    return owners


def _liveness(sections: dict[str, str]) -> Optional[dict[str, Any]]:
    """As ``node.liveness.node_liveness`` says it; ``checked_from`` is this look's shell's
    own start, so any wrapper started after the look began is never taken for a lost one."""
    boot = sections.get("boot", "").strip()
    checked_from = start_in_stat(sections.get("self", "").encode())
    if not boot or checked_from is None or processes_hidden_in(sections.get("mounts", "")):
        return None
    wrappers = []
    lines = sections.get("wrappers", "").split("\n")
    for i, line in enumerate(lines):
        # "@w PID", "c " its command line (NULs as \x1f, newlines \x1e), "s " its stat
        if not line.startswith("@w ") or i + 2 >= len(lines):
            continue
        cmdline, stat = lines[i + 1], lines[i + 2]
        if not cmdline.startswith("c ") or not stat.startswith("s "):
            continue
        argv = cmdline[2:].encode().replace(b"\x1e", b"\n").split(b"\x1f")
        start = start_in_stat(stat[2:].encode())
        if start is not None and is_wrapper_argv(argv) and line[3:].isdigit():
            wrappers.append([int(line[3:]), start])
    return {"boot_id": boot, "checked_from": checked_from, "wrappers": wrappers}
