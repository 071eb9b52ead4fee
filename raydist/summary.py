"""What a finished job hands over: a typed summary, written as summary.json in its run directory.

Every job ends by writing `<run.storage_path>/<run.name>/summary.json` (atomically: a reader never sees half a
file) and printing the same object as its last stdout line. Programs read the file; `compare` does.
The field reference in docs/strategies.md is generated from the `help` metadata below.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Any, Literal, get_type_hints

from raydist import registry
from raydist.atomic import write_json_atomic
from raydist.summary_fields import described

SUMMARY_FILE = "summary.json"
RESULT_ENV = "RAYDIST_RESULT_FILE"
"""When set, a job also writes its summary to this path (batch mode reads the job's status there)."""


@dataclass
class CommonSummary:
    """What every training job's summary holds; `JobSummary` adds the fields registry entries declare."""

    strategy: str = described(f"registry name of the strategy: {', '.join(registry.names())}")
    run_name: str = described("run.name")
    run_dir: str = described("<run.storage_path>/<run.name>: checkpoints, metrics.jsonl, this file")
    ray: str = described("'local' for the embedded instance, else the cluster address the job used")
    workers: int = described(
        "training workers at the end (scaling.num_workers, or fewer in an elastic run that lost nodes)"
    )
    status: Literal["completed", "stopped"] = described(
        "completed: the run reached its step budget; stopped: it ended early at a checkpoint it resumes from"
    )
    steps: int = described("optimizer steps done, over the whole run (async: gradient updates from all workers)")
    total_steps: int = described("steps the run is configured for; status is completed when steps reaches it")
    resumed_from_step: int | None = described("the step this session resumed from, or null for a fresh start")
    wall_s: float = described("seconds from the job's start to its end, Ray start-up included")
    train_time_s: float | None = described("seconds this session spent in its training loop")
    test_accuracy: float | None = described("accuracy on the whole test split at the end")
    test_loss: float | None = described("mean cross-entropy on the test split at the end")
    final_loss: float | None = described("training loss at the end (mean over workers)")
    samples_per_s: float | None = described("training samples per second over this session, all workers together")
    steps_per_s: float | None = described("steps per second over this session")
    checkpoint: str | None = described("directory of the last checkpoint")
    metrics_file: str = described("per-step records (metrics.jsonl), appended across resumes")
    bytes_per_worker: list[float] = described(
        "payload bytes each worker sent plus received this session (algorithm volume)", []
    )
    wait_s_per_worker: list[float] = described("seconds each worker spent waiting on others this session", [])
    peak_memory_bytes_per_worker: list[int] = described(
        "each worker's peak memory this session: the process's peak resident set on CPU (ru_maxrss; interpreter, "
        "torch, Ray and data included), torch.cuda.max_memory_allocated on GPU (loop strategies)",
        [],
    )
    param_bytes_per_worker: list[int] = described(
        "parameter bytes each worker holds between steps: the whole model, or its shard under fsdp (loop strategies)",
        [],
    )
    stop_reason: str | None = described(
        "why a stopped run stopped: train.stop_at_step, a stop request (SLURM time limit, preemption), a draining node",
        None,
    )
    startup_s: dict[str, float] | None = described(
        "seconds from the job's process start until: Ray connected (`connect`), the workers' training function began "
        "(`workers`), model, data and checkpoint were ready (`ready`), the first step was done (`first_step`); "
        "Ray Train strategies",
        None,
    )
    restarts: int = described("times the run replaced failed workers or servers and went on from a checkpoint", 0)
    warm_workers: int = described(
        "workers of the last start forked by their node's warm interpreter, torch already imported "
        "(scaling.engine=launch on a cluster the SLURM bring-up started: docs/launch.md)",
        0,
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self) -> Path:
        os.makedirs(self.run_dir, exist_ok=True)
        return write_json_atomic(Path(self.run_dir) / SUMMARY_FILE, self.to_dict())

    @classmethod
    def read(cls, path: str | Path) -> CommonSummary:
        path = Path(path)
        if path.is_dir():
            path = path / SUMMARY_FILE
        return cls(**json.loads(path.read_text()))


def _own_fields() -> list[tuple[str, Any, Any]]:
    """Each registry entry's declared summary fields (`StrategySpec.summary_fields`), in registry order; null or
    empty in other strategies' summaries."""
    own = []
    for spec in registry.all_specs():
        if spec.summary_fields:
            cls = spec.load("summary_fields")
            hints = get_type_hints(cls)
            own += [
                (f.name, hints[f.name], field(default=f.default, metadata=f.metadata)) for f in dataclasses.fields(cls)
            ]
    return own


JobSummary = make_dataclass(
    "JobSummary",
    _own_fields(),
    bases=(CommonSummary,),
    namespace={"__doc__": "One training job's outcome: the common fields, then each strategy's own."},
)
JobSummary.__module__ = __name__


def fields_markdown(cls: type = JobSummary) -> str:
    """The summary's fields as a markdown table (docs/strategies.md embeds it)."""
    rows = ["| field | meaning |", "|---|---|"]
    for f in dataclasses.fields(cls):
        meaning = f.metadata["help"].replace("|", "\\|")
        rows.append(f"| `{f.name}` | {meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(fields_markdown(), end="")
