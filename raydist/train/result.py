"""Rank 0's last report of a fit, as a file in the run directory: the driver's summary comes from it when Ray
Train's result holds an older one. Ray Train returns the metrics of the newest checkpoint it consolidated from every
worker's report; with Ray 2.60, a run whose heal replacement joined at its last step was seen to return a report
from mid-run (the final round lost while the replica group was replaced), and its summary said "stopped"."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from raydist.atomic import write_json_atomic


def _path(run_dir: str, fit_id: str) -> Path:
    return Path(run_dir) / f".final-{fit_id}.json"


def write_final_result(run_dir: str, fit_id: str, metrics: dict[str, Any], checkpoint_step: int | None) -> None:
    write_json_atomic(_path(run_dir, fit_id), {"metrics": metrics, "checkpoint_step": checkpoint_step})


def newer_final_result(run_dir: str, fit_id: str, step: int | None) -> tuple[dict[str, Any], str | None] | None:
    """This fit's final metrics and checkpoint directory when they are past `step` (the result Ray Train returned),
    else None."""
    try:
        final = json.loads(_path(run_dir, fit_id).read_text())
    except (OSError, ValueError):
        return None
    metrics = final.get("metrics") or {}
    if not isinstance(metrics.get("step"), int) or metrics["step"] <= (step if isinstance(step, int) else -1):
        return None
    at = final.get("checkpoint_step")
    directory = os.path.join(run_dir, f"checkpoint_step{at:08d}") if isinstance(at, int) else None
    return metrics, directory if directory and os.path.isdir(directory) else None
