"""How a run ended, as its summary says it: the status, the ranks of the last start, the root cause, the start-up
times; handed over as summary.json and $RAYDIST_RESULT_FILE."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from raydist.atomic import write_json_atomic
from raydist.launcher.policy import Decision
from raydist.launcher.rank_events import first_failed
from raydist.launcher.settings import LaunchConfig
from raydist.launcher.summary import LaunchSummary
from raydist.summary import RESULT_ENV


class Timeline:
    """Seconds from raydist launch's start to each first: connected, placed, started, first_output, first_step."""

    def __init__(self, started: float):
        self.started = started  # time.perf_counter() at raydist launch's start
        self.marks: dict[str, float] = {}
        self.first_step_unix: float | None = None

    def mark(self, what: str) -> None:
        self.marks.setdefault(what, round(time.perf_counter() - self.started, 3))

    def stepped(self, first_step_unix: float | None) -> None:
        if first_step_unix and self.first_step_unix is None:
            self.first_step_unix = first_step_unix

    def startup(self) -> dict[str, float]:
        out = dict(self.marks)
        if self.first_step_unix is not None:
            from raydist.driver.session import process_start_time

            out["first_step"] = round(self.first_step_unix - process_start_time(), 3)
        return out

    def wall_s(self) -> float:
        return round(time.perf_counter() - self.started, 3)


def summarize(
    cfg: LaunchConfig,
    group,
    decision: Decision,
    *,
    status: str,
    ray: str,
    command: list[str],
    restarts: int,
    failures: list[str],
    logs: Path,
    timeline: Timeline,
) -> LaunchSummary:
    """The summary of a run that ended with `decision` (as `status`), `group` its last start."""
    return LaunchSummary(
        run_name=cfg.name,
        run_dir=cfg.run_dir,
        ray=ray,
        command=command,
        workers=len(group.ranks),
        status=status,
        exit_code=decision.exit_code,
        reason=decision.reason,
        restarts=restarts,
        wall_s=timeline.wall_s(),
        ranks=[
            {
                "rank": r.rank,
                "node": r.node,
                "iface": r.slot.place.iface,
                "pid": r.pid,
                "exit_code": r.exit_code,
                "warm": r.warm,
                "exit_fault": r.exit_fault,
            }
            for r in group.ranks
        ],
        failures=failures,
        logs=str(logs),
        startup_s=timeline.startup(),
        error=root_cause(group) if status == "failed" else None,
    )


def root_cause(group) -> dict[str, Any] | None:
    """What the first failed rank wrote to TORCHELASTIC_ERROR_FILE (a script decorated with @record)."""
    failed = [r for r in group.ranks if r.error and not r.exit_fault]
    if not failed:
        return None
    r = first_failed(failed)
    return {"rank": r.rank, "node": r.node, **r.error}


def hand_over(summary: LaunchSummary) -> None:
    """summary.json in the run dir, and $RAYDIST_RESULT_FILE where set (SLURM batch mode decides on requeueing by
    it)."""
    summary.write()
    if os.environ.get(RESULT_ENV):
        write_json_atomic(Path(os.environ[RESULT_ENV]), summary.to_dict())
