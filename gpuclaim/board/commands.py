"""The board's keys that act on the selected GPU: claim, release, kill, attach, and the log.

The UI side of them: asking and confirming in dialogs, running the blocking core calls of
``gpuclaim.board.actions`` in worker threads, and telling the user how it went. A mixin of
``BoardApp``: textual finds ``action_*`` methods and ``on_<message>`` handlers anywhere in the
app's MRO. (``@on`` handlers are collected by textual's metaclass, so a plain mixin like this
one must not use ``@on``; ``@work`` is fine.)
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Callable, Optional

from textual import work
from textual.app import SuspendNotSupported

from gpuclaim.board import actions
from gpuclaim.board.dialogs import ClaimDialog, ConfirmDialog
from gpuclaim.board.messages import ActionDone, LogChunk
from gpuclaim.core.errors import GpuclaimError
from gpuclaim.core.model import Job
from gpuclaim.core.states import GpuState, started
from gpuclaim.remote.channels import attach_command

if TYPE_CHECKING:
    from textual.app import App

    from gpuclaim.board.data import BoardData
    from gpuclaim.board.services import BoardServices
    from gpuclaim.board.widgets import LogPanel
    from gpuclaim.engine.cluster import GpuRow

    _AppBase = App[int]
else:
    _AppBase = object


class BoardCommands(_AppBase):
    """Claim, release, kill, attach and the log panel, for ``BoardApp`` to mix in."""

    # What the app provides (see BoardApp).
    services: BoardServices
    data: Optional[BoardData]
    log_panel: LogPanel

    _reading_log = False  # a read of the open log panel's job is in flight

    if TYPE_CHECKING:

        def _selected_rows(self) -> list[GpuRow]: ...

        def _tick(self) -> None: ...

        def _request_read(self) -> None: ...

    # -- claim, release, kill -----------------------------------------------------------------
    def action_claim(self) -> None:
        rows = self._selected_rows()
        node = None
        free = any(r.state == GpuState.FREE for r in rows)
        if free and rows[0].node not in self._drained():
            node = rows[0].node
        names = [n.name for n in self.services.config.nodes]
        dialog = ClaimDialog(names, node, self.services.config.limits.default_time_s)

        def submitted(form: Optional[actions.ClaimForm]) -> None:
            if form is not None:
                self._claim(form)

        self.push_screen(dialog, submitted)

    def _drained(self) -> dict[str, object]:
        return dict(self.data.view.drains) if self.data else {}

    @work(thread=True, group="action", exit_on_error=False)
    def _claim(self, form: actions.ClaimForm) -> None:
        self._act(lambda: actions.claim_message(actions.claim(self.services, form)))

    def action_release(self) -> None:
        rows = self._selected_rows()
        mine = actions.own_claims(rows, self.services.user)
        if not mine:
            held = [r.claim for r in rows if r.claim is not None]
            if held:
                self.notify(
                    f"held by {held[0].user}: only they can release it "
                    f"(or 'gpuclaim release --force {held[0].id}', which is logged)",
                    severity="warning",
                )
            else:
                self.notify("nothing of yours to release here", severity="warning")
            return
        what = "; ".join(
            f"{c.node} GPU{'s' if len(c.gpus) > 1 else ''} {','.join(c.labels)}"
            f" (claim {c.id}{', job still running' if c.job else ''})"
            for c in mine
        )

        def confirmed(yes: Optional[bool]) -> None:
            if yes:
                self._release([c.id for c in mine])

        self.push_screen(ConfirmDialog(f"Release {what}?", yes="Release"), confirmed)

    @work(thread=True, group="action", exit_on_error=False)
    def _release(self, claim_ids: list[str]) -> None:
        def run() -> str:
            released = actions.release(self.services, claim_ids)
            if not released:
                return "Nothing to release: those claims were already gone."
            return "\n".join(
                f"Released {c.node} GPU {','.join(c.labels)}, claim {c.id}." for c in released
            )

        self._act(run)

    def _selected_job(self, own: bool) -> Optional[Job]:
        job = actions.job_of(self.data, self._selected_rows()) if self.data else None
        if job is None:
            self.notify("no running job on the selected GPU", severity="warning")
            return None
        if own and job.user != self.services.user:
            self.notify(f"job {job.name} belongs to {job.user}", severity="warning")
            return None
        return job

    def action_kill(self) -> None:
        job = self._selected_job(own=True)
        if job is None:
            return
        where = "; ".join(f"{r.node} GPU {','.join(map(str, r.gpus))}" for r in job.ranks)

        def confirmed(yes: Optional[bool]) -> None:
            if yes:
                self.notify(f"stopping {job.name}…")
                self._kill(job)

        self.push_screen(ConfirmDialog(f"Kill job {job.name} on {where}?", yes="Kill"), confirmed)

    @work(thread=True, group="action", exit_on_error=False)
    def _kill(self, job: Job) -> None:
        self._act(lambda: f"{job.name}: {actions.kill(self.services, job).state}.")

    def _act(self, run: Callable[[], str]) -> None:
        """In a worker: run an action and tell the UI how it went, in one line."""
        try:
            self.post_message(ActionDone(run()))
        except GpuclaimError as exc:
            self.post_message(ActionDone(str(exc), ok=False))
        except Exception as exc:
            self.post_message(ActionDone(f"internal error: {type(exc).__name__}: {exc}", False))

    def on_action_done(self, message: ActionDone) -> None:
        self.notify(message.text, severity="information" if message.ok else "error", timeout=8)
        self._request_read()

    # -- attach -------------------------------------------------------------------------------
    def action_attach(self) -> None:
        job = self._selected_job(own=True)
        if job is None:
            return
        if not started(job.state) or not job.ranks:
            self.notify(f"job {job.name} is {job.state}; nothing to attach to", severity="warning")
            return
        argv = attach_command(self.services.config, job.ranks[0].node, job.session)
        try:
            with self.suspend():
                self.services.foreground(argv)
        except SuspendNotSupported:
            self.notify(
                f"this terminal cannot be handed over; run: {shlex.join(argv)}",
                severity="warning",
            )
            return
        self._tick()

    # -- the log panel ------------------------------------------------------------------------
    def action_log(self) -> None:
        panel = self.log_panel
        job = actions.job_of(self.data, self._selected_rows()) if self.data else None
        if panel.has_class("-open") and (job is None or job.id == panel.job_id):
            panel.remove_class("-open")
            panel.job_id = None
            return
        if job is None:
            self.notify("no running job on the selected GPU", severity="warning")
            return
        panel.clear()
        panel.job_id, panel.log_offset = job.id, None
        node = job.ranks[0].node if job.ranks else "?"
        panel.border_title = f"{job.name} on {node} · log (l or Esc closes)"
        panel.add_class("-open")
        self._reading_log = False
        self._follow_log()

    def _follow_log(self) -> None:
        """Read more of the open panel's log, unless a read is in flight (every refresh)."""
        panel = self.log_panel
        if not panel.has_class("-open") or panel.job_id is None or self._reading_log:
            return
        job = self.data.jobs.get(panel.job_id) if self.data else None
        if job is None:
            return  # it ended: the panel keeps what it showed
        self._reading_log = True
        self._read_log(job, panel.log_offset)

    @work(thread=True, exclusive=True, group="log", exit_on_error=False)
    def _read_log(self, job: Job, offset: Optional[int]) -> None:
        try:
            text, new_offset = actions.read_log(self.services, job, offset)
            self.post_message(LogChunk(job.id, text, new_offset))
        except Exception as exc:
            self.post_message(LogChunk(job.id, "", offset or 0, error=str(exc)))

    def on_log_chunk(self, message: LogChunk) -> None:
        self._reading_log = False
        panel = self.log_panel
        if message.job_id != panel.job_id:
            return
        if message.error:
            if panel.log_offset is None:
                panel.write_line(f"[cannot read the log: {message.error}]")
                panel.log_offset = 0
            return
        if message.text:
            panel.write(message.text)
        panel.log_offset = message.offset
