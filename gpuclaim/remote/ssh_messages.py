"""What the ``ssh`` binary's failures mean, in the same one-line words as the paramiko path
(``describe_ssh_error``), so a node's row reads the same whichever client reached it."""

from __future__ import annotations

import re

_RESOLVE = re.compile(r"Could not resolve hostname [^:]+: (.+)$", re.I)


def describe_ssh_failure(stderr: str, connect_timeout: float) -> str:
    """One line a person can act on, from ssh's stderr (exit status 255)."""
    text = stderr.strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    last = lines[-1] if lines else "ssh failed"
    lower = text.lower()
    if "remote host identification has changed" in lower:
        return (
            "HOST KEY CHANGED: refusing to connect (if the node was reinstalled, remove the "
            "old key with ssh-keygen -R)"
        )
    if "host key verification failed" in lower or "no matching host key" in lower:
        return (
            "unknown host key (not in known_hosts); connect once with ssh to check and accept "
            "it, or add it with ssh-keyscan"
        )
    if "connection refused" in lower:
        return "connection refused (is sshd running?)"
    if "banner exchange" in lower:
        return f"no SSH banner within {connect_timeout:g}s (sshd hung, or the node is)"
    if "timed out" in lower:
        return "connection timed out"
    match = next((m for m in map(_RESOLVE.search, lines) if m), None)
    if match:
        return f"unknown host ({match.group(1).strip()})"
    if "permission denied" in lower:
        return f"authentication failed ({last})"
    if "connection closed by" in lower or "connection reset" in lower:
        return f"connection lost ({last})"
    return last
