"""What the board's worker threads tell the UI thread: small dataclass messages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from textual.message import Message

from gpuclaim.board.data import BoardData, NodeSample


@dataclass
class NodeProbed(Message):
    """One node answered its probe (or failed to: the sample says why)."""

    node: str
    sample: NodeSample


@dataclass
class BoardRead(Message):
    """The store was read and joined with the latest probes."""

    data: BoardData


@dataclass
class ReadFailed(Message):
    """The store could not be read; the board keeps showing what it had, marked with age."""

    error: str


@dataclass
class ActionDone(Message):
    """A claim, release or kill finished: what to tell the user."""

    text: str
    ok: bool = True


@dataclass
class LogChunk(Message):
    """More of a job's log, from ``offset`` on; ``error`` when it could not be read."""

    job_id: str
    text: str
    offset: int
    error: Optional[str] = None
