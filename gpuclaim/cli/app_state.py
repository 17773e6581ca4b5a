"""The state of one command: the config, the store, the prober, loaded when first used.

No typer here: ``entry.fast`` answers ``status`` with it, without typer's start."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Union

from gpuclaim.cli.console import err
from gpuclaim.core.identity import current_user

if TYPE_CHECKING:  # imported when used: `gpuclaim --help` must not pay for them
    from gpuclaim.core.config import Config
    from gpuclaim.engine.cluster import NodeProber
    from gpuclaim.engine.dispatch import Explained, QueueReport
    from gpuclaim.engine.launch import NodeOps
    from gpuclaim.store import Store


@dataclass
class AppState:
    """Set by the top-level callback from the global options; loaded lazily."""

    config_path: Optional[Path] = None
    looking: bool = False  # a command that only looks: storage refusing writes is no error
    _refusal_said: bool = field(default=False, repr=False)
    _config: Optional[Config] = field(default=None, repr=False)
    _store: Optional[Store] = field(default=None, repr=False)
    _prober: Optional[NodeProber] = field(default=None, repr=False)
    revived: bool = False  # this command's look started the services it found down

    @property
    def config(self) -> Config:
        if self._config is None:
            from gpuclaim.app.configfile import load_config

            self._config = load_config(self.config_path)
            for warning in self._config.warnings:
                err().print(f"warning: {warning}")
        return self._config

    def finish(self) -> None:
        """After every command: post pending Slack messages, bounded by the short timeout.
        A look at storage that refuses writes says so (once), even if it needed no write."""
        refusal = getattr(self._store, "refusal", None)
        if self.looking and refusal is not None:
            self.refused(refusal)
        if self._store is not None and self._config is not None and not self.revived:
            self.revive_quietly()
        if self._store is not None and self._config is not None:
            self.keep_keepers()
        if self._config is None or self._store is None or not self._config.slack.webhook_url:
            return
        from gpuclaim.core.errors import GpuclaimError

        try:
            from gpuclaim.engine.notify import deliver

            deliver(self.config, self._store, budget_s=self._config.slack.timeout_s)
        except GpuclaimError:
            pass  # delivery never fails a command; the next one tries again

    @property
    def user(self) -> str:
        return current_user(self.config.user)

    @property
    def prober(self) -> NodeProber:
        """One per process: it holds the SSH connections, reused by every command step."""
        if self._prober is None:
            from gpuclaim.app.wiring import make_prober

            self._prober = make_prober(self.config)
        return self._prober

    @property
    def ops(self) -> NodeOps:
        from gpuclaim.engine.launch import NodeOps

        return NodeOps(self.config, self.prober)

    def dispatch_quietly(self, every: Union[bool, Explained] = False) -> Optional[QueueReport]:
        """Any gpuclaim call starts queued jobs that now fit: the queue needs no daemon.
        With ``every``, each queued job is judged (why it waits), for a listing (with an
        ``Explained``, the ones it names)."""
        from gpuclaim.core.errors import GpuclaimError, StorageRefusesWrites

        try:
            entries = self.store.queue_entries()
        except GpuclaimError:
            return None  # the command itself reports a broken config or storage
        if not entries:
            return None
        from gpuclaim.engine.dispatch import judge_queue  # here: an empty queue needs none of it

        try:
            return judge_queue(self.config, self.store, self.prober, self.ops, every=every)
        except StorageRefusesWrites as exc:
            self.refused(exc)
        except GpuclaimError as exc:
            err().print(f"warning: could not start queued jobs: {exc}")
        return None

    def revive_quietly(self) -> None:
        """Any command that read the store starts the services it finds down on nodes that
        answer (a rebooted node's), as ``status`` does: only its own account's, one command
        per service winning the turn; the others are said to be their owners' to start."""
        from gpuclaim.core.errors import GpuclaimError, StorageRefusesWrites
        from gpuclaim.core.states import SERVICE_DOWN

        self.revived = True
        try:
            # a service's claim held, or one already judged down: its node is asked (a
            # rebooted node's answer proves its wrapper gone before its beats are old)
            claims = self.store.snapshot().claims.values()
            held = {s.claim.node for s in claims if s.claim.service or s.reason == SERVICE_DOWN}
            known = [n for n in self.config.nodes if n.name in held]
            if not known:
                return
            from gpuclaim.cli.revival_lines import say_revival
            from gpuclaim.engine.cluster import build_view, shown_max_age
            from gpuclaim.engine.services import revive_services, services_down

            age = shown_max_age(self.config)  # not a placement: a recent read will do
            view = build_view(self.config, self.store, known, prober=self.prober, max_age_s=age)
            if services_down(view):
                say_revival(revive_services(self.config, self.store, view, self.ops))
        except StorageRefusesWrites as exc:
            self.refused(exc)
        except GpuclaimError as exc:
            err().print(f"warning: could not start services found down: {exc}", markup=False)

    def keep_keepers(self) -> None:
        """This account's queued jobs have a queue keeper of this account on each node they
        could start on: one lost with a reboot is started again by any command of its owner
        (else a job behind an expiring claim would wait for someone to look)."""
        from gpuclaim.core.accounts import Account, keeper_lock
        from gpuclaim.core.errors import GpuclaimError
        from gpuclaim.core.states import JobState

        try:
            from gpuclaim.core.priority import parse_entry

            entries = [e for e in map(parse_entry, self.store.queue_entries()) if e is not None]
            # another person's are skipped by the name their entry holds, without the record
            mine = (None, self.user)  # once: the property validates the name each time
            entries = [e for e in entries if e.user in mine]
            if not entries:
                return  # none of ours: a busy day's queue of others costs nothing more
            me = Account.from_dict(self.store.whoami())
            from gpuclaim.engine.launch import NodeOps, keeper_spec, nodes_for

            wanted: set[str] = set()
            for entry in entries:
                if len(wanted) == len(self.config.nodes):
                    break  # every node wanted already: no more records to read
                job = self.store.load_job(job_id=entry.job_id)
                if job is None or job.state != JobState.QUEUED or job.uid != me.uid:
                    continue
                if job.nodes_wanted == 1:  # a gang is placed by the laptop's dispatch
                    wanted.update(n.name for n in nodes_for(self.config, job))
            # a keeper this command started may not hold its lock yet: not started again
            wanted -= NodeOps.keepers_started
            lost = sorted(
                n for n in wanted if not self.store.lock_held(name=keeper_lock(n, me.uid))
            )
            if not lost:
                return
            from gpuclaim.core.fanout import fan_out

            ops = self.ops
            fan_out(
                lost,
                lambda name: ops.keep_queue(self.config.node(name), keeper_spec(self.config, name)),
                self.config.limits.deadline_s,
            )
        except GpuclaimError:
            pass  # a node away, storage hiccups: the next command tries again

    def refused(self, exc: object) -> None:
        """Say once per command that the storage refuses writes, and what that means here."""
        if not self._refusal_said:
            self._refusal_said = True
            err().print(f"warning: {exc}; showing what it holds, nothing was recorded")

    @contextlib.contextmanager
    def side_work(self) -> Iterator[None]:
        """Work a look does on the way (notices, cursors, samples): best effort when the
        storage refuses writes, said once."""
        from gpuclaim.core.errors import StorageRefusesWrites

        try:
            yield
        except StorageRefusesWrites as exc:
            self.refused(exc)

    @property
    def store(self) -> Store:
        if self._store is None:
            from gpuclaim.app.wiring import open_store

            store = open_store(self.config, self.prober)
            create = self.config.storage_default  # only this machine's own default store
            if self.looking:
                with self.side_work():  # a layout it cannot make: read what is there
                    store.ensure(create=create)
            else:
                store.ensure(create=create)
            self._store = store
        return self._store
