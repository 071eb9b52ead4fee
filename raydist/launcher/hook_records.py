"""Rank 0's values from the optional hook (`raydist.hook.report(step=..., loss=...)`), one record per step the
launcher saw, appended to metrics.jsonl in the run directory: what MLflow logs for a launched run. Kept only where
tracking is on; the hook writes at most every 0.5 s, so a fast loop's steps are sampled, not all there."""

from __future__ import annotations

import json
import os
from typing import Any

from raydist.observability.metrics import METRICS_FILE

NOT_VALUES = ("step", "first_step_unix", "updated_unix")


class HookRecords:
    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, METRICS_FILE)
        self.last_step: int | None = None
        self._file = None

    def note(self, status: dict[str, Any]) -> None:
        step = status.get("step")
        if not isinstance(step, int) or step == self.last_step:
            return
        self.last_step = step
        values = {k: v for k, v in status.items() if k not in NOT_VALUES and isinstance(v, (int, float))}
        if self._file is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._file = open(self.path, "a", buffering=1)
        self._file.write(json.dumps({"step": step, **values}) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
