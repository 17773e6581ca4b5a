"""Slack delivery's turn in the store: one deliverer at a time on any host and over ssh://
storage (a lock cannot be held across the agent's requests), a dead holder's turn runs out,
and delivery reads the event logs through the store's interface alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpuclaim.core.config import parse_config
from gpuclaim.core.model import Event, EventType
from gpuclaim.engine import notify
from gpuclaim.store import ClaimStore, Store

T0 = 1_800_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> ClaimStore:
    s = ClaimStore(tmp_path / "store", tmp_path / "locks")
    s.ensure(create=True)
    return s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [T0]
    monkeypatch.setattr("gpuclaim.store.notices.time.time", lambda: now[0])
    return now


def test_one_holder_at_a_time_and_the_holder_may_take_it_again(store, clock) -> None:
    assert store.take_turn("notify", "a", 10.0)
    assert not store.take_turn("notify", "b", 10.0)
    assert store.take_turn("notify", "a", 10.0)  # its own turn, renewed
    store.end_turn("notify", "a")
    assert store.take_turn("notify", "b", 10.0)


def test_a_dead_holders_turn_runs_out(store, clock) -> None:
    assert store.take_turn("notify", "died", 10.0)
    clock[0] += 9.9
    assert not store.take_turn("notify", "next", 10.0)
    clock[0] += 0.2
    assert store.take_turn("notify", "next", 10.0)


def test_only_the_holder_gives_it_back(store, clock) -> None:
    assert store.take_turn("notify", "a", 10.0)
    store.end_turn("notify", "b")
    assert not store.take_turn("notify", "b", 10.0)


@pytest.mark.parametrize("damage", [b"", b"{not json", b'{"holder": "x", "until": "soon"}'])
def test_a_damaged_turn_file_holds_nothing(store, clock, damage: bytes) -> None:
    (store.root / "notify").mkdir(parents=True, exist_ok=True)
    (store.root / "notify" / "turn-notify.json").write_bytes(damage)
    assert store.take_turn("notify", "a", 10.0)


def test_the_event_log_reads_as_one_character_per_byte(store) -> None:
    event = Event(ts=T0, type=EventType.CLAIM, user="alice", node="node01", reason="é")
    store.append_event(event)
    (log,) = store.event_logs()
    text = store.read_event_log(log, 0)
    size = (store.root / "events" / f"{log}.jsonl").stat().st_size
    assert len(text) == size and text.endswith("\n")
    assert json.loads(text)["reason"] == "é"  # ASCII JSON: the escape survives
    assert store.read_event_log(log, size) == ""


class _Posts:
    def __init__(self) -> None:
        self.texts: list[str] = []

    def __call__(self, url: str, message: dict, timeout: float) -> notify.PostResult:
        self.texts.append(message["text"])
        return notify.PostResult(ok=True, status=200, body="ok")


def test_delivery_posts_each_event_once_and_leaves_the_turn_free(store, monkeypatch) -> None:
    posts = _Posts()
    monkeypatch.setattr(notify, "post", posts)
    monkeypatch.setattr(notify, "MIN_INTERVAL_S", 0.0)
    config = parse_config(
        {
            "cluster": "t",
            "storage": str(store.root),
            "nodes": ["node01"],
            "slack": {"webhook_url": "https://hooks.slack.com/services/T/B/x", "events": ["claim"]},
        }
    )
    for n in range(3):
        store.append_event(Event(ts=time.time(), type=EventType.CLAIM, user=f"u{n}", node="n"))
    interface: Store = store  # delivery needs nothing beyond the interface
    assert notify.deliver(config, interface, budget_s=5.0).sent == 3
    assert notify.deliver(config, interface, budget_s=5.0).sent == 0
    assert len(posts.texts) == 3
    assert store.take_turn(notify.TURN, "someone", 1.0)  # given back
