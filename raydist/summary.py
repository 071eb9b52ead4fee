"""What a finished job hands over: a typed summary, written as summary.json in its run directory.

Every job ends by writing `<run.storage_path>/<run.name>/summary.json` (atomically: a reader never sees half a
file) and printing the same object as its last stdout line. Programs read the file; `compare` does.
The field reference in docs/strategies.md is generated from the `help` metadata below.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from raydist.atomic import write_json_atomic

SUMMARY_FILE = "summary.json"
RESULT_ENV = "RAYDIST_RESULT_FILE"
"""When set, a job also writes its summary to this path (batch mode reads the job's status there)."""


def _f(help: str, default: Any = dataclasses.MISSING) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class JobSummary:
    """One training job's outcome (sync DDP, local SGD, async PS, FSDP)."""

    strategy: str = _f("registry name of the strategy: sync, local_sgd, async, fsdp")
    run_name: str = _f("run.name")
    run_dir: str = _f("<run.storage_path>/<run.name>: checkpoints, metrics.jsonl, this file")
    ray: str = _f("'local' for the embedded instance, else the cluster address the job used")
    workers: int = _f("training workers at the end (scaling.num_workers, or fewer in an elastic run that lost nodes)")
    status: Literal["completed", "stopped"] = _f(
        "completed: the run reached its step budget; stopped: it ended early at a checkpoint it resumes from")
    steps: int = _f("optimizer steps done, over the whole run (async: gradient updates from all workers)")
    total_steps: int = _f("steps the run is configured for; status is completed when steps reaches it")
    resumed_from_step: int | None = _f("the step this session resumed from, or null for a fresh start")
    wall_s: float = _f("seconds from the job's start to its end, Ray start-up included")
    train_time_s: float | None = _f("seconds this session spent in its training loop")
    test_accuracy: float | None = _f("accuracy on the whole test split at the end")
    test_loss: float | None = _f("mean cross-entropy on the test split at the end")
    final_loss: float | None = _f("training loss at the end (mean over workers)")
    samples_per_s: float | None = _f("training samples per second over this session, all workers together")
    steps_per_s: float | None = _f("steps per second over this session")
    checkpoint: str | None = _f("directory of the last checkpoint")
    metrics_file: str = _f("per-step records (metrics.jsonl), appended across resumes")
    bytes_per_worker: list[float] = _f("payload bytes each worker sent plus received this session (algorithm volume)", [])
    wait_s_per_worker: list[float] = _f("seconds each worker spent waiting on others this session", [])
    peak_memory_bytes_per_worker: list[int] = _f(
        "each worker's peak memory this session: the process's peak resident set on CPU (ru_maxrss; interpreter, "
        "torch, Ray and data included), torch.cuda.max_memory_allocated on GPU (loop strategies)", [])
    param_bytes_per_worker: list[int] = _f(
        "parameter bytes each worker holds between steps: the whole model, or its shard under fsdp (loop strategies)",
        [])
    stop_reason: str | None = _f(
        "why a stopped run stopped: train.stop_at_step, a stop request (SLURM time limit, preemption), a draining node",
        None)
    startup_s: dict[str, float] | None = _f(
        "seconds from the job's process start until: Ray connected (`connect`), the workers' training function began "
        "(`workers`), model, data and checkpoint were ready (`ready`), the first step was done (`first_step`); "
        "Ray Train strategies", None)
    restarts: int = _f("times the run replaced failed workers or servers and went on from a checkpoint", 0)
    # The parameter server's own books; null for strategies without servers.
    servers: int | None = _f("async: parameter-server shards", None)
    server_hosts: list[str] | None = _f("async: the host of each server shard (async_ps.server_placement)", None)
    staleness_mean: float | None = _f("async: mean staleness (server versions) of the applied updates", None)
    staleness_max: int | None = _f("async: largest staleness of an applied update", None)
    dropped: int | None = _f("async: gradients discarded as too stale (async_ps.on_stale=drop)", None)
    steps_per_worker: list[int] | None = _f("async: steps each worker computed this session", None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self) -> Path:
        os.makedirs(self.run_dir, exist_ok=True)
        return write_json_atomic(Path(self.run_dir) / SUMMARY_FILE, self.to_dict())

    @classmethod
    def read(cls, path: str | Path) -> "JobSummary":
        path = Path(path)
        if path.is_dir():
            path = path / SUMMARY_FILE
        return cls(**json.loads(path.read_text()))


def fields_markdown(cls: type = JobSummary) -> str:
    """The summary's fields as a markdown table (docs/strategies.md embeds it)."""
    rows = ["| field | meaning |", "|---|---|"]
    for f in dataclasses.fields(cls):
        meaning = f.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{f.name}` | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(fields_markdown(), end="")
