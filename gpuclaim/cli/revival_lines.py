"""What a look says of the services it found down: started again, left to their owner, or
not started (why). Used by ``status`` and by every command's end (``AppState.finish``)."""

from __future__ import annotations

from typing import Any

from gpuclaim.cli.console import err


def say_revival(revival: Any, quiet: bool = False) -> None:
    """Services this look started again, on stderr (``--json`` stays parseable)."""
    for job, cause in [] if quiet else revival.started:
        where = job.ranks[0].node if job.ranks else "its node"
        err().print(
            f"started {job.user}'s service {job.name} again on {where} ({cause})", markup=False
        )
    for job, cause in revival.owners:
        from gpuclaim.core.accounts import owner_name  # here: only another's service down

        where = job.ranks[0].node if job.ranks else "its node"
        who = owner_name(job)
        err().print(
            f"{job.user}'s service {job.name} is down on {where} ({cause}): only {who}'s "
            f"account starts it again, at {who}'s next gpuclaim command there",
            markup=False,
        )
    for job, error in revival.failed:
        err().print(
            f"warning: could not start {job.user}'s service {job.name} again: {error}"
            " (the next look tries again)",
            markup=False,
        )
