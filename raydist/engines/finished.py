"""A run that already completed with the same config is reported again without starting Ray.

Running a finished run a second time (a second `make run`) used to start Ray and Ray Train, resume from the last
checkpoint at the last step, train nothing and print the same summary, in most of a minute. Each job now records
the config its summary came from (`<run_dir>/job.json`, written after summary.json); when the run's summary says it
completed, with the same job, config and last checkpoint on disk, the job prints that summary again at once. Any change to the config that could change
the run (more epochs, another learning rate, more workers) goes the full way and resumes from the checkpoint.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from raydist.atomic import write_json_atomic
from raydist.config import Config
from raydist.summary import SUMMARY_FILE, JobSummary

JOB_FILE = "job.json"
OUTSIDE_THE_RUN = {"run": ("verbose", "address")}
"""Keys that change how a job is watched or where it runs, not what it computes."""


def run_record(job: str, cfg: Config) -> dict[str, Any]:
    """What decides a run's outcome: the job and its config, less OUTSIDE_THE_RUN."""
    config = cfg.to_dict()
    for section, keys in OUTSIDE_THE_RUN.items():
        config[section] = {k: v for k, v in config[section].items() if k not in keys}
    return {"job": job, "config": config}


def record(job: str, cfg: Config) -> None:
    """Note the job and config that the run's summary.json, just written, came from. (Not before the run: a job
    refused on joining a cluster writes nothing.)"""
    os.makedirs(cfg.run.run_dir, exist_ok=True)
    write_json_atomic(Path(cfg.run.run_dir) / JOB_FILE, run_record(job, cfg))


def forget(cfg: Config) -> None:
    """Drop the record before a session starts: if it dies after writing its summary but before its record, the
    earlier session's record must not vouch for the new summary."""
    (Path(cfg.run.run_dir) / JOB_FILE).unlink(missing_ok=True)


def completed_summary(job: str, cfg: Config) -> JobSummary | None:
    """The summary of this run if it completed with this very job and config and its checkpoint is still there."""
    run_dir = Path(cfg.run.run_dir)
    try:
        recorded = json.loads((run_dir / JOB_FILE).read_text())
        summary = JobSummary.read(run_dir / SUMMARY_FILE)
    except (OSError, ValueError, TypeError):  # none yet, torn, or a summary of another kind (compare's)
        return None
    if recorded != json.loads(json.dumps(run_record(job, cfg))):  # through JSON, as the file went: tuples, keys
        return None
    if summary.strategy != job or summary.status != "completed" or summary.steps != summary.total_steps:
        return None
    if summary.checkpoint and not os.path.isdir(summary.checkpoint):
        return None
    return summary


def notice(summary: JobSummary) -> str:
    return (
        f"[raydist] {summary.run_name} already completed {summary.steps} steps with this config; its summary "
        f"again, without starting Ray (to train again: another run.name, or remove {summary.run_dir})"
    )
