"""One error hierarchy; the CLI turns each into a one-line message and its exit code."""

from __future__ import annotations

import enum

TYPE_CHECKING = False  # typing.TYPE_CHECKING: a node's first look need not import typing
if TYPE_CHECKING:
    from typing import Any


class ExitCode(enum.IntEnum):
    """Documented exit codes (README, DESIGN): scripts rely on them."""

    OK = 0
    ERROR = 1
    USAGE = 2
    CONFLICT = 3  # nothing free, or someone else holds it
    UNREACHABLE = 4  # some nodes did not answer; the output still lists the rest
    NAME_IN_USE = 5  # a running or queued job of yours already has that name


class GpuclaimError(Exception):
    """Base class: a message for the user and the exit code that goes with it."""

    exit_code: ExitCode = ExitCode.ERROR

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(GpuclaimError):
    """The config file is missing a key, has a wrong type, or does not parse."""


class UsageError(GpuclaimError):
    """The user asked for something malformed (bad duration, unknown node...)."""

    exit_code = ExitCode.USAGE


class ConflictError(GpuclaimError):
    """Nothing free right now, or the GPU is held by someone else."""

    exit_code = ExitCode.CONFLICT


class NameInUseError(GpuclaimError):
    """A name the user picked is taken by one of their own running or queued jobs (or its
    tmux session): not "nothing free", which is about GPUs, so not exit 3."""

    exit_code = ExitCode.NAME_IN_USE


class NeverFitsError(GpuclaimError):
    """The request can never be satisfied by this cluster (e.g. more GPUs than any node has)."""


class StoreError(GpuclaimError):
    """The shared storage cannot be read or written."""


class IllegalTransition(StoreError):
    """A change of a job's state that the table in core/states.py does not allow (e.g. an
    end overwritten by another): refused, the record left as it was."""


class StorageRefusesWrites(StoreError):
    """The storage can be read but not written: read-only, full, over quota, or not ours to
    write. Looking still works (from what can be read); acting fails with this one line."""


class ProbeError(GpuclaimError):
    """No GPU information could be obtained on a node (no driver, nvidia-smi failed)."""


class UnreachableError(GpuclaimError):
    """A node could not be reached."""

    exit_code = ExitCode.UNREACHABLE


class AnswerLostError(UnreachableError):
    """The request reached the node, and its answer did not come back: it may have been done
    there (a launch whose wrapper starts all the same)."""


# -- the wire: how an error crosses from the node agent to the CLI, one codec both ends use ---
def error_to_wire(exc: BaseException) -> dict[str, Any]:
    """``{"type", "message", "hint"}``: our errors by class name; an OSError as a StoreError
    (the agent's file work is the store's)."""
    if isinstance(exc, GpuclaimError):
        return {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}
    if isinstance(exc, OSError):
        return {"type": "StoreError", "message": f"{exc.strerror}: {exc.filename}", "hint": None}
    return {"type": "GpuclaimError", "message": str(exc), "hint": None}


def error_from_wire(err: Any) -> GpuclaimError:
    """The error an agent answered with, as the class it named (GpuclaimError when unknown:
    an older or newer agent must never make the CLI crash on a name)."""
    if not isinstance(err, dict):
        return GpuclaimError(f"agent: malformed error {err!r}")
    cls = globals().get(str(err.get("type")))
    if not (isinstance(cls, type) and issubclass(cls, GpuclaimError)):
        cls = GpuclaimError
    hint = err.get("hint")
    return cls(str(err.get("message")), hint=str(hint) if hint else None)
