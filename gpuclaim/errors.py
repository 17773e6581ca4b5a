"""One error hierarchy; the CLI turns each into a one-line message and its exit code."""

from __future__ import annotations

import enum


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


class StorageRefusesWrites(StoreError):
    """The storage can be read but not written: read-only, full, over quota, or not ours to
    write. Looking still works (from what can be read); acting fails with this one line."""


class ProbeError(GpuclaimError):
    """No GPU information could be obtained on a node (no driver, nvidia-smi failed)."""


class UnreachableError(GpuclaimError):
    """A node could not be reached."""

    exit_code = ExitCode.UNREACHABLE
