"""Slack (and Mattermost) notifications that never get in the way.

The event log is the outbox: every message is an event that is already on shared storage.
Whoever runs gpuclaim next (a CLI call, ``gc``, a job's wrapper on its node) delivers what is
not delivered yet, from a per-log-file cursor kept on the storage, under a lock so two
deliverers never post the same event. A post has a short timeout; a server that is down,
slow or rate-limiting just leaves the rest for the next deliverer; permanent errors are
recorded for ``doctor`` and ``notify test`` and are not retried forever.

Standard library only: job wrappers deliver from the nodes (the laptop may be closed).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any, Optional
from uuid import uuid4

from gpuclaim.core.config import Config, SlackConfig
from gpuclaim.core.durations import format_duration
from gpuclaim.core.identity import this_host
from gpuclaim.core.model import Event, EventType, JobKind
from gpuclaim.core.states import GpuState, JobState, job_state, unhandled
from gpuclaim.engine.array_records import ALL_SUCCEEDED
from gpuclaim.engine.bookings import booking_event
from gpuclaim.engine.cluster import ClusterView
from gpuclaim.store import Store

# The ``[slack] events`` name of the messages that a node became unreachable.
UNREACHABLE_MESSAGES = GpuState.UNREACHABLE.value
PREEMPTED_MESSAGES = JobState.PREEMPTED.value  # a preemptible job yields its GPUs
SERVICE_MESSAGES = JobKind.SERVICE.value  # a service went down, came back (gave up: its end)
OWNER_MESSAGES = "owner"  # a job waits for its owner's account; a record naming one refused
SHARE_MESSAGES = "share"  # a share's job used more than its share of its GPU
# Event types that become messages, and their names in ``[slack] events``.
MESSAGE_EVENTS: dict[str, str] = {
    EventType.JOB_START: "job_started",
    EventType.JOB_END: "job_ended",
    EventType.JOB_CANCELLED: "job_ended",
    EventType.ARRAY_START: "job_started",
    EventType.ARRAY_END: "job_ended",
    EventType.CLAIM: "claim",
    EventType.RELEASE: "release",
    EventType.EXPIRE: "expired",
    EventType.FORCE_RELEASE: "forced",
    EventType.FORCE_KILL: "forced",
    EventType.PREEMPT: PREEMPTED_MESSAGES,
    EventType.SERVICE_DOWN: SERVICE_MESSAGES,
    EventType.SERVICE_BACK: SERVICE_MESSAGES,
    EventType.CLAIM_EXPIRING: "expiring",
    EventType.BUSY_UNCLAIMED: "busy_unclaimed",
    EventType.NODE_UNREACHABLE: UNREACHABLE_MESSAGES,
    EventType.CLAIM_IDLE: "idle",
    EventType.RESERVE: "reservation",
    EventType.RESERVE_CANCEL: "reservation",
    EventType.RESERVE_OPEN: "reservation",
    EventType.RESERVE_NOSHOW: "reservation",
    EventType.OWNER_TURN: OWNER_MESSAGES,
    EventType.REFUSED: OWNER_MESSAGES,
    EventType.SHARE_EXCEEDED: SHARE_MESSAGES,
}
DEFAULT_EVENTS = (
    "job_started",
    "job_ended",
    "expiring",
    "expired",
    "busy_unclaimed",
    UNREACHABLE_MESSAGES,
    "idle",
    "forced",
    "reservation",
    PREEMPTED_MESSAGES,
    SERVICE_MESSAGES,
    OWNER_MESSAGES,
    SHARE_MESSAGES,
)
PERMANENT_ERRORS = (
    "invalid_payload",
    "no_service",
    "channel_not_found",
    "channel_is_archived",
    "action_prohibited",
    "posting_to_general_channel_denied",
    "invalid_token",
    "no_team",
    "team_disabled",
)
MIN_INTERVAL_S = 1.0  # Slack: about one message per second per webhook
FIRST_RUN_WINDOW_S = 600.0
TURN = "notify"  # the store's delivery turn: one deliverer at a time


@dataclass(frozen=True)
class PostResult:
    """How one POST to Slack went, and whether (and when) to try it again."""

    ok: bool
    status: Optional[int]  # HTTP status, None if no answer
    body: str
    retry_after: Optional[float] = None
    permanent: bool = False

    def describe(self) -> str:
        if self.status is None:
            return f"no answer: {self.body}"
        return f"HTTP {self.status}: {self.body[:200] or '(empty body)'}"


def post(url: str, payload: dict[str, Any], timeout: float) -> PostResult:
    """One POST; never raises, never mentions the URL (it is a secret)."""
    # Here, not at the top: urllib.request costs 25 ms, and every look imports this module.
    import urllib.error
    import urllib.request

    data = json.dumps(payload).encode()
    request = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            body = resp.read(2048).decode("utf-8", "replace").strip()
            return PostResult(True, resp.status, body)
    except urllib.error.HTTPError as exc:
        body = exc.read(2048).decode("utf-8", "replace").strip() if exc.fp else ""
        retry = exc.headers.get("Retry-After") if exc.headers else None
        permanent = exc.code in (400, 403, 404, 410) and (
            exc.code in (404, 410) or any(p in body for p in PERMANENT_ERRORS)
        )
        return PostResult(False, exc.code, body, _seconds(retry), permanent)
    except urllib.error.URLError as exc:
        reason = exc.reason if isinstance(exc.reason, str) else type(exc.reason).__name__
        text = getattr(exc.reason, "strerror", None) or reason
        return PostResult(False, None, str(text))
    except (TimeoutError, OSError) as exc:
        return PostResult(False, None, f"{type(exc).__name__}: timed out or refused")


def _seconds(value: Optional[str]) -> Optional[float]:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# -- messages -----------------------------------------------------------------------------------


def wanted(event: Event, slack: SlackConfig) -> bool:
    kind = MESSAGE_EVENTS.get(event.type)
    if kind is None:
        return False
    if event.extra.get("array"):
        return False  # one task of an array: the array's start and end say it, once each
    if event.type == EventType.JOB_END and event.extra.get("state") == JobState.PREEMPTED:
        return False  # its preemption was said when it was asked to yield: one line each
    chosen = slack.events or DEFAULT_EVENTS
    if kind not in chosen and event.type not in chosen:
        return False
    return event.user not in slack.opt_out


def render_message(event: Event, slack: SlackConfig) -> dict[str, Any]:
    """Block Kit with a plain-text fallback; short enough for a phone. Everything that comes
    from users or jobs (names, notes, reasons, log lines) is escaped as Slack asks (``&``,
    ``<``, ``>``): a log line ``<!channel>`` stays text, never a mass mention or a link."""
    who = _mention(event.user, slack)
    extra = {k: _esc(v) if isinstance(v, str) else v for k, v in event.extra.items()}
    node = _esc(event.node or "")
    reason = _esc(event.reason or "")
    where = f"{node} GPU {','.join(map(str, event.gpus))}" if node else ""
    if event.type == EventType.JOB_END:
        return _job_end_message(event, extra, who, reason, where)
    if event.type == EventType.ARRAY_END:
        return _array_end_message(event, extra, who)
    if event.type == EventType.ARRAY_START:
        limit = f", at most {extra['max_running']} at once" if extra.get("max_running") else ""
        text = f"▶️ {who}'s array *{extra.get('job')}* started: {extra.get('count')} tasks{limit}"
    elif event.type == EventType.JOB_CANCELLED:
        text = f"🚫 {who}'s job *{extra.get('job')}* was cancelled: {reason}"
    elif event.type == EventType.JOB_START:
        queued = " (from the queue)" if extra.get("from_queue") else ""
        text = f"▶️ {who}'s job *{extra.get('job')}* started{queued} on {where}"
    elif event.type == EventType.CLAIM:
        text = f"🔒 {who} claimed {where}" + (f": {extra['note']}" if extra.get("note") else "")
    elif event.type in (EventType.RELEASE, EventType.FORCE_RELEASE):
        by = f" (released by {_esc(event.by)})" if event.by and event.by != event.user else ""
        text = f"🔓 {who} released {where}{by}"
    elif event.type == EventType.FORCE_KILL:
        killer = _esc(event.by or "?")
        text = f"🛑 {who}'s job *{extra.get('job')}* was killed by {killer} (--force)"
    elif event.type == EventType.PREEMPT:
        then = "goes back to the queue" if extra.get("requeue") else "ends"
        text = (
            f"⏏ {who}'s preemptible job *{extra.get('job')}* yields {where} to "
            f"{_esc(event.by or '?')} and {then}"
        )
    elif event.type == EventType.SERVICE_DOWN:
        text = f"🔻 {who}'s service *{extra.get('job')}* on {where} is down: {reason}; restarting"
    elif event.type == EventType.SERVICE_BACK:
        restarts = extra.get("restarts")
        text = f"🔺 {who}'s service *{extra.get('job')}* on {where} is back (restart {restarts})"
    elif event.type == EventType.OWNER_TURN:
        text = (
            f"⏳ {who}, your queued job *{extra.get('job')}* fits now and waits for you: {reason}"
        )
    elif event.type == EventType.REFUSED:
        text = (
            f"🚨 a job *{extra.get('job')}* naming {who} was refused by {_esc(event.by or '?')}"
            f" and never ran: {_esc(str(extra.get('why') or ''))}"
        )
    elif event.type == EventType.SHARE_EXCEEDED:
        text = _over_share_text(extra, who, where)
    elif event.type == EventType.EXPIRE:
        text = f"⌛ {who}'s claim on {where} expired"
    elif event.type == EventType.CLAIM_EXPIRING:
        text = f"⏳ {who}, your claim on {where} ends in {extra.get('left', 'a few minutes')}"
    elif event.type == EventType.CLAIM_IDLE:
        text = f"💤 {who}, your claim on {where} looks idle: {reason}. Release it?"
    elif event.type.startswith(EventType.RESERVE):  # every booking event
        text = _reservation_text(event, extra, who, where)
    elif event.type == EventType.BUSY_UNCLAIMED:
        text = f"⚠️ {where} is busy without a claim: {reason}"
    elif event.type == EventType.NODE_UNREACHABLE:
        text = f"🔌 {node} is unreachable: {reason}"
    else:
        text = f"{_esc(event.type)}: {who} {where}"
    return {"text": _plain(text), "blocks": [_section(text)]}


def _job_end_message(
    event: Event, extra: dict[str, Any], who: str, reason: str, where: str
) -> dict[str, Any]:
    """A job's end: its state and exit code, why where that is news, time and GPU-hours."""
    state = extra.get("state", "ended")
    icon = _end_icon(state)
    duration = (event.ts - event.since) if event.since else 0.0
    gpus = int(extra.get("gpus_total") or len(event.gpus) or 1)
    text = f"{icon} {who}'s job *{extra.get('job')}* {state}"
    if extra.get("exit_code") is not None and state != JobState.SUCCEEDED:
        text += f" (exit code {extra['exit_code']})"
    if reason.startswith("gave up"):  # a service that kept dying: why it stays down
        text += f": {reason}"
    elif state == JobState.KILLED and reason not in ("", "kill", JobState.KILLED.value):
        text += f": {reason}"  # not a `gpuclaim kill`: its share, a signal from outside
    details = f"{where} · {format_duration(duration)} · {gpus * duration / 3600:.2f} GPU-h"
    tail = extra.get("log_tail")
    blocks = [_section(text), _context(details)]
    if tail:
        blocks.append(_section(f"```{tail[-1500:]}```"))
    return {"text": f"{_plain(text)} - {details}", "blocks": blocks}


def _over_share_text(extra: dict[str, Any], who: str, where: str) -> str:
    stopped = "; stopped ([share] enforce = kill)" if extra.get("enforce") == "kill" else ""
    return (
        f"🐘 {who}'s job *{extra.get('job')}* on {where} used {extra.get('used_mib')} MiB, "
        f"more than its share of {extra.get('share_mib')} MiB{stopped}"
    )


def _reservation_text(event: Event, extra: dict[str, Any], who: str, where: str) -> str:
    window = f"{_when(event.since)} to {_when(event.expires)}"
    rid = extra.get("reservation", "")
    if event.type == EventType.RESERVE:
        note = f": {extra['note']}" if extra.get("note") else ""
        return f"📅 {who} booked {where} from {window} ({rid}){note}"
    if event.type == EventType.RESERVE_CANCEL:
        by = f" by {_esc(event.by)} (--force)" if event.by and event.by != event.user else ""
        return f"🗑 {who}'s booking of {where}, {window}, was cancelled{by} ({rid})"
    if event.type == EventType.RESERVE_OPEN:
        return f"🔔 {who}, your booking of {where} is open until {_when(event.expires)} ({rid})"
    return (
        f"🕳 {who}'s booking of {where} was released: nobody claimed it within "
        f"{extra.get('grace') or 'the grace period'} of {_when(event.since)} ({rid})"
    )


def end_icon(state: JobState) -> str:
    """The icon of a job's end message: one per state (the ends that are not a success,
    failure, timeout or kill, and the states that are no end, get a plain bullet)."""
    if state is JobState.SUCCEEDED:
        return "✅"
    if state is JobState.FAILED:
        return "❌"
    if state is JobState.TIMEOUT:
        return "⏱"
    if state is JobState.KILLED:
        return "🛑"
    if state is JobState.PREEMPTED:
        return "⏏"
    if (
        state is JobState.LOST
        or state is JobState.CANCELLED
        or state is JobState.QUEUED
        or state is JobState.STARTING
        or state is JobState.RUNNING
    ):
        return "•"
    unhandled(state)


def _end_icon(value: object) -> str:
    """``end_icon`` for a logged state; a plain bullet for one this version does not know."""
    state = job_state(value) if isinstance(value, str) else None
    return "•" if state is None else end_icon(state)


def _when(ts: Optional[float]) -> str:
    """Slack shows ``<!date^...>`` in each reader's own time zone; the fallback is UTC."""
    if ts is None:
        return "?"
    fallback = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ts))
    return f"<!date^{int(ts)}^{{date_short_pretty}} {{time}}|{fallback}>"


def _array_end_message(event: Event, extra: dict[str, Any], who: str) -> dict[str, Any]:
    """One summary for a whole array: counts by state, the indices that did not succeed."""
    states = extra.get("states") or {}
    ok = bool(extra.get(ALL_SUCCEEDED))
    icon = "✅" if ok else "❌"
    counts = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
    text = f"{icon} {who}'s array *{extra.get('job')}* ended: {counts}"
    details = f"{extra.get('count')} tasks · {float(extra.get('gpu_hours') or 0):.2f} GPU-h"
    blocks = [_section(text), _context(details)]
    bad = extra.get("unsuccessful") or {}
    if bad:
        lines = [f"{s}: {_indices(v)}" for s, v in sorted(bad.items())]
        blocks.append(_section("\n".join(lines)))
    return {"text": f"{_plain(text)} - {details}", "blocks": blocks}


def _indices(values: list[int], most: int = 40) -> str:
    shown = ", ".join(str(v) for v in values[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "")


def _mention(user: str, slack: SlackConfig) -> str:
    """gpuclaim's own markup, the one thing left raw: a member id from the admin's config."""
    member = dict(slack.mentions).get(user)
    return f"<@{member}>" if member else _esc(user)


def _esc(text: str) -> str:
    """Slack's three control characters, as its formatting rules say to escape them."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}}


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:2900]}]}


def _plain(text: str) -> str:
    return text.replace("*", "")


# -- notices: conditions seen by whoever looks (status, board, gc) -------------------------------

EXPIRING_WITHIN_S = 15 * 60


def record_notices(view: ClusterView, store: Store) -> list[Event]:
    """Log an event, once per episode, for claims about to expire, GPUs busy without a
    claim and unreachable nodes, so that Slack hears of them even if nobody is looking."""
    now = view.snapshot.now
    events: list[Event] = []
    expiring = [
        s.claim
        for s in view.snapshot.claims.values()
        if s.state == GpuState.CLAIMED
        and 0 < s.claim.expires - now < EXPIRING_WITHIN_S
        and not s.claim.job  # a job's claim ends with its time limit: no reminder
    ]
    for cid in store.mark_notices(scope="expiring", keys=[c.id for c in expiring]):
        c = next(c for c in expiring if c.id == cid)
        events.append(
            Event(
                ts=now,
                type=EventType.CLAIM_EXPIRING,
                user=c.user,
                claim_id=c.id,
                node=c.node,
                gpus=tuple(c.indices),
                extra={"left": format_duration(c.expires - now)},
            )
        )
    busy = {r.uuid: r for r in view.rows if r.state == GpuState.BUSY_UNCLAIMED and r.uuid}
    for uuid in store.mark_notices(scope="busy", keys=sorted(busy)):
        r = busy[uuid]
        users = sorted({p.user for p in r.foreign if p.user}) or ["someone"]
        events.append(
            Event(
                ts=now,
                type=EventType.BUSY_UNCLAIMED,
                user=users[0],
                node=r.node,
                gpus=(r.index or 0,),
                reason=r.reason,
            )
        )
    opened = {b.id: b for b in view.snapshot.bookings if b.is_open(now) and not b.handover}
    for bid in store.mark_notices(scope="booking-open", keys=sorted(opened)):
        events.append(booking_event(EventType.RESERVE_OPEN, opened[bid], now))
    unreachable = GpuState.UNREACHABLE.value  # the fallback reason, and the notices' scope
    down = {name: view.inventories[name].error or unreachable for name in view.unreachable}
    for node in store.mark_notices(scope=unreachable, keys=sorted(down)):
        events.append(
            Event(ts=now, type=EventType.NODE_UNREACHABLE, user="", node=node, reason=down[node])
        )
    for event in events:
        store.append_event(event)
    return events


# -- delivery -----------------------------------------------------------------------------------


@dataclass
class DeliveryReport:
    """What one delivery of pending Slack messages did."""

    sent: int = 0
    pending: bool = False  # something is left for the next deliverer
    last_error: Optional[str] = None


def deliver(config: Config, store: Store, budget_s: float = 2.0) -> DeliveryReport:
    """Post undelivered events within ``budget_s`` (plus at most one post's timeout), in the
    store's delivery turn (one deliverer at a time, on any host, over any store)."""
    report = DeliveryReport()
    slack = config.slack
    if not slack.webhook_url:
        return report
    holder = f"{this_host()}-{os.getpid()}-{uuid4().hex[:8]}"
    turn_s = budget_s + 2 * slack.timeout_s + 5  # outlasts this delivery, however it goes
    taken = store.take_turn(TURN, holder, turn_s)
    give_up = time.monotonic() + budget_s / 2
    while not taken and time.monotonic() < give_up:
        time.sleep(0.1)  # another process is delivering: it may be done soon
        taken = store.take_turn(TURN, holder, turn_s)
    if not taken:
        report.pending = True
        return report
    try:
        _deliver_in_turn(slack, store, budget_s, report)
    finally:
        store.end_turn(TURN, holder)
    return report


def _deliver_in_turn(
    slack: SlackConfig, store: Store, budget_s: float, report: DeliveryReport
) -> None:
    state = store.read_notify("state.json")
    if time.time() < float(state.get("not_before", 0)):
        report.pending = True
        return
    deadline = time.monotonic() + budget_s
    last_post = 0.0
    for log in store.event_logs():
        cursor_name = f"cursor-{log}.json"
        cursor = store.read_notify(cursor_name)
        offset = int(cursor.get("offset", 0))
        # A webhook configured today does not post the lab's whole history.
        skip_before = time.time() - FIRST_RUN_WINDOW_S if not cursor else 0.0
        # one character per byte: the last piece has no newline yet (still being written)
        for line in store.read_event_log(log, offset).split("\n")[:-1]:
            event = _parse(line)
            if event is not None and event.ts >= skip_before and wanted(event, slack):
                if time.monotonic() > deadline:
                    report.pending = True
                    return
                wait = MIN_INTERVAL_S - (time.monotonic() - last_post)
                if wait > 0:
                    time.sleep(wait)
                result = post(slack.webhook_url, render_message(event, slack), slack.timeout_s)
                last_post = time.monotonic()
                if not result.ok and not result.permanent:
                    report.pending = True
                    report.last_error = result.describe()
                    state.update(last_error=report.last_error, last_error_at=time.time())
                    if result.retry_after is not None:
                        state["not_before"] = time.time() + result.retry_after
                    store.write_notify("state.json", state)
                    return
                if result.permanent:
                    # Not retried forever: recorded for doctor / notify test, then dropped.
                    state.update(permanent_error=result.describe(), permanent_error_at=time.time())
                    store.write_notify("state.json", state)
                else:
                    report.sent += 1
            offset += len(line) + 1
            store.write_notify(cursor_name, {"offset": offset})
    if report.sent and state.get("last_error"):
        state.pop("last_error", None)
        store.write_notify("state.json", state)


def slack_problems(state: dict[str, Any]) -> list[tuple[str, str]]:
    """Doctor's view of delivery: (problem, fix) pairs."""
    problems = []
    if state.get("permanent_error"):
        problems.append(
            (
                f"Slack refused a message for good: {state['permanent_error']}",
                "check [slack] webhook_url (revoked? channel gone?), then gpuclaim notify test",
            )
        )
    if state.get("last_error"):
        problems.append(
            (
                f"Slack delivery is behind: {state['last_error']}",
                "messages wait in the event log and go out once the webhook answers",
            )
        )
    return problems


def _parse(line: str) -> Optional[Event]:
    try:
        return Event.from_dict(json.loads(line))
    except (ValueError, KeyError, TypeError):
        return None
