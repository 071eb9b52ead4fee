"""What `raydist launch` hands over: a typed summary, `summary.json` in the run directory (and $RAYDIST_RESULT_FILE,
which SLURM batch mode reads to decide about requeueing). docs/launch.md embeds the field table."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from raydist.atomic import write_json_atomic
from raydist.summary import SUMMARY_FILE
from raydist.summary_fields import described


@dataclass
class LaunchSummary:
    """One launched script's outcome."""

    run_name: str = described("the run's name (--name; default launch-<script>)")
    run_dir: str = described("<storage_path>/<name>: logs/, stacks/, this file")
    ray: str = described("'local' for the embedded instance, else the cluster address")
    command: list[str] = described("the command every rank ran", [])
    workers: int = described("ranks of the last start (WORLD_SIZE)", 0)
    status: Literal["completed", "stopped", "exit_fault", "failed"] = described(
        "completed: every rank exited 0; stopped: a stop request (time limit, preemption, an interrupt) ended the "
        "ranks with stop_signal; exit_fault: every rank's script returned (the training finished), but a rank then "
        "died or hung on its way out (interpreter teardown, atexit, a destructor): not restarted, not requeued; "
        "failed: a rank failed after max_restarts, or exited 2",
        "failed",
    )
    exit_code: int = described("raydist launch's exit status: 0, 1 (failed or exit_fault) or 2 (a rank exited 2)", 1)
    reason: str = described("the one line that says how the run ended", "")
    restarts: int = described("restarts of the whole group (TORCHELASTIC_RESTART_COUNT of the last start)", 0)
    wall_s: float = described("seconds from raydist launch's start to its end", 0.0)
    ranks: list[dict[str, Any]] = described(
        "each rank of the last start: rank, node, iface (its node's GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME), pid, exit_code, warm (forked by its node's warm interpreter: docs/launch.md), exit_fault (how it failed after its script returned, or '')",
        [],
    )
    failures: list[str] = described("each failure's line, in order (restarts and the final one)", [])
    logs: str = described("the directory of each rank's whole output, rank<N>.log", "")
    error: dict[str, Any] | None = described(
        "a failed run's root cause, when the failing rank's script wrote TORCHELASTIC_ERROR_FILE (decorated with "
        "torch's @record, as under torchrun): rank, node, message (exception type and message), where (file:line)",
        None,
    )
    startup_s: dict[str, float] | None = described(
        "seconds since raydist launch started: connected (to Ray), placed (every process reserved), started "
        "(every script started), first_output (a rank's first line), first_step (the first raydist.hook.report)",
        None,
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self) -> Path:
        Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        return write_json_atomic(Path(self.run_dir) / SUMMARY_FILE, self.to_dict())

    @classmethod
    def read(cls, path: str | Path) -> LaunchSummary:
        path = Path(path)
        return cls(**json.loads((path / SUMMARY_FILE if path.is_dir() else path).read_text()))


if __name__ == "__main__":
    from raydist.summary import fields_markdown

    print(fields_markdown(LaunchSummary), end="")
