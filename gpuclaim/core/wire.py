"""Values across the agent's JSON: plain JSON as it is, our records by name.

A record (a class with ``to_dict``/``from_dict``, or ``to_record``/``from_record`` where its
``to_dict`` is a display shape, as a booking's ``--json``) travels as ``{"$t": NAME, "v":
DICT}``, a tuple as ``{"$t": "tuple", "v": LIST}``; a plain dict that happens to hold a
``"$t"`` key is wrapped too, so nothing is ever taken for what it is not.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

TAG = "$t"


class Codec:
    def __init__(self, records: Iterable[type]) -> None:
        self.records: dict[str, Any] = {cls.__name__: cls for cls in records}

    def encode(self, value: Any) -> Any:
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        if isinstance(value, list):
            return [self.encode(v) for v in value]
        if isinstance(value, tuple):
            return {TAG: "tuple", "v": [self.encode(v) for v in value]}
        if isinstance(value, dict):
            plain = {str(k): self.encode(v) for k, v in value.items()}
            return {TAG: "dict", "v": plain} if TAG in plain else plain
        name = type(value).__name__
        if name in self.records:
            dump = getattr(value, "to_record", None) or value.to_dict
            return {TAG: name, "v": dump()}
        raise TypeError(f"cannot send a {name} to or from the agent")

    def decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self.decode(v) for v in value]
        if not isinstance(value, dict):
            return value
        tag = value.get(TAG)
        if tag is None:
            return {k: self.decode(v) for k, v in value.items()}
        inner = value.get("v")
        if tag == "tuple":
            return tuple(self.decode(v) for v in inner or ())
        if tag == "dict":
            return {k: self.decode(v) for k, v in (inner or {}).items()}
        cls = self.records.get(str(tag))
        if cls is None:
            raise ValueError(f"unknown record {tag!r} from the agent")
        load = getattr(cls, "from_record", None) or cls.from_dict
        return load(inner)
