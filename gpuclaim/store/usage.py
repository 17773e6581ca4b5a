"""How busy claimed GPUs really are: one rolling summary per claim."""

from __future__ import annotations

import json
import os
from typing import Optional, cast

from gpuclaim.core.records import UsageSample, UsageSummary
from gpuclaim.core.usage import fold_sample
from gpuclaim.store.base import StoreBase
from gpuclaim.store.files import _encode, _safe


class UsagePart(StoreBase):
    def record_usage(self, samples: dict[str, UsageSample], threshold_pct: float) -> None:
        """Fold one utilisation sample per claim ({claim id: {"since": t, "utils": [..]}}) into
        its rolling summary, timed by the storage clock. Bounded: a few numbers per claim."""
        now = self.now()
        for claim_id, sample in samples.items():
            path = self._p("usage", f"{_safe(claim_id)}.json")
            with self.gpu_lock(f"usage-{_safe(claim_id)}"):
                try:
                    current = json.loads(path.read_text("utf-8"))
                except (OSError, ValueError):
                    current = None
                summary = fold_sample(
                    current, float(sample["since"]), now, list(sample["utils"]), threshold_pct
                )
                self._publish(self._stage(_encode(summary), sync=False), path)

    def usage_summaries(self, ids: Optional[list[str]] = None) -> dict[str, UsageSummary]:
        result: dict[str, UsageSummary] = {}
        directory = self._p("usage")
        try:
            names = [f"{i}.json" for i in ids] if ids is not None else os.listdir(directory)
        except FileNotFoundError:
            return result
        for name in names:
            try:
                data = json.loads((directory / name).read_text("utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(data, dict):
                result[name[: -len(".json")]] = cast(UsageSummary, data)
        return result
