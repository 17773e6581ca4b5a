"""What proves that a job is its account's to run (store/owners.py, core/accounts.py): its
owner's spec file, in a directory nobody else may write. The two-account end-to-end proof is
tests/test_accounts.py; here every way a spec can fail to vouch, in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuclaim.core.accounts import Account, runs_as, this_account, what_runs
from gpuclaim.core.errors import StoreError
from gpuclaim.core.model import Job
from gpuclaim.store import ClaimStore
from tests.unit.job_factory import new_store


def _job(store: ClaimStore, job_id: str = "j-1", **more: object) -> Job:
    return Job(job_id, "train", "ann", ("python", "t.py"), "queued", store.now(), 600.0, **more)  # type: ignore[arg-type]


def _spec(store: ClaimStore, job_id: str = "j-1") -> Path:
    return store.root / "owners" / str(os.getuid()) / f"{job_id}.json"


def test_a_created_job_is_its_writers_and_its_spec_vouches_for_it(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = store.create_job(_job(store))
    me = this_account()
    assert (job.uid, job.account) == (me.uid, me.name)
    assert (
        store.load_job("j-1").to_dict()
        == job.with_(submitted=store.load_job("j-1").submitted).to_dict()
    )
    assert runs_as(job, me) and store.check_job(job) == ""
    spec = _spec(store)
    assert oct(spec.stat().st_mode & 0o777) == "0o644"
    assert oct(spec.parent.stat().st_mode & 0o7777) == "0o755"
    assert json.loads(spec.read_text())["run"] == what_runs(job)


def test_a_record_naming_an_account_gets_no_spec_and_is_refused(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    me = this_account()
    forged = store.create_job(_job(store, uid=me.uid, account=me.name))
    assert not _spec(store).exists()
    assert "never submitted it" in store.check_job(forged)


def test_a_changed_command_a_foreign_account_or_no_account_is_refused(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = store.create_job(_job(store))
    assert "argv is not what" in store.check_job(job.with_(argv=("rm", "-rf", "/")))
    assert "env is not what" in store.check_job(job.with_(env=(("LD_PRELOAD", "/x.so"),)))
    assert "workdir is not what" in store.check_job(job.with_(workdir="/elsewhere"))
    other = job.with_(uid=job.uid + 1 if job.uid is not None else 1, account="bob")
    assert store.check_job(other).startswith("it is bob's job")
    assert not runs_as(other, this_account())
    assert "names no account" in store.check_job(job.with_(uid=None))


def test_a_spec_others_may_write_or_replace_vouches_for_nothing(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    job = store.create_job(_job(store))
    spec = _spec(store)
    spec.chmod(0o664)
    assert "may be written by others" in store.check_job(job)
    assert any("may be written by others" in line for line in store.misowned_specs())
    spec.chmod(0o644)
    spec.parent.chmod(0o775)
    assert "may be written by others" in store.check_job(job)
    spec.parent.chmod(0o755)
    target = tmp_path / "elsewhere.json"
    target.write_text(spec.read_text())
    spec.unlink()
    spec.symlink_to(target)  # a link another account could have put there
    assert "cannot be read" in store.check_job(job)
    spec.unlink()
    assert store.misowned_specs() == []


def test_a_requeued_run_points_at_its_first_runs_spec(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    first = store.create_job(_job(store))
    again = store.create_job(first.with_(id="j-2", restarts=1, spec=first.id))
    assert again.uid == first.uid and not _spec(store, "j-2").exists()
    assert store.check_job(again) == ""


def test_an_accounts_directory_that_is_not_its_own_stops_its_submits(tmp_path: Path) -> None:
    store = new_store(tmp_path)
    own = store.root / "owners" / str(os.getuid())
    own.mkdir(parents=True)
    own.chmod(0o777)  # as if someone else made it for us, open to all
    with pytest.raises(StoreError, match=r"is not .*'s alone"):
        store.create_job(_job(store))
    assert any(str(own) in line for line in store.misowned_specs())


def test_an_account_round_trips() -> None:
    me = this_account()
    assert Account.from_dict(me.to_dict()) == me


def test_the_owner_is_told_in_words_and_a_refusal_names_who_refused() -> None:
    from gpuclaim.core.config import parse_config
    from gpuclaim.core.model import Event, EventType
    from gpuclaim.engine.notify import render_message, wanted

    slack = parse_config({"storage": "/tmp/x", "slack": {"webhook_url": "http://x/"}}).slack
    turn = Event(
        1.0, EventType.OWNER_TURN, "alice", node="node01",
        reason="waits for alice's keeper on node01; alice's next gpuclaim command starts it",
        extra={"job": "q", "job_id": "j-1"},
    )  # fmt: skip
    assert wanted(turn, slack)
    text = render_message(turn, slack)["text"]
    assert "alice, your queued job q fits now and waits for you" in text, text
    refused = Event(
        2.0, EventType.REFUSED, "alice", by="alice",
        extra={"job": "forged", "why": "alice never submitted it <!channel>"},
    )  # fmt: skip
    text = render_message(refused, slack)["text"]
    assert "refused by alice" in text and "<!channel>" not in text, text
