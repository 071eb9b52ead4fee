"""Training metrics: per-step records on rank 0 (metrics.jsonl in the run directory) and throughput windows."""

from __future__ import annotations

import json
import os
import time
from typing import Any

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends one JSON record per optimizer step; a resumed run appends to the same file, so read with `read_steps`."""

    def __init__(self, run_dir: str, enabled: bool):
        self.path = os.path.join(run_dir, METRICS_FILE)
        self._file = None
        if enabled:
            os.makedirs(run_dir, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def read_steps(path: str) -> dict[int, dict[str, Any]]:
    """step -> its latest record (a step re-run after a restart replaces the earlier one)."""
    records: dict[int, dict[str, Any]] = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if "step" in r:
                    records[r["step"]] = r
    return records


def startup_records(path: str) -> list[dict[str, float]]:
    """The `startup` records of a run's metrics.jsonl, one per session start (wall-clock times at which rank 0's
    training function began, was ready, and finished its first step), in order."""
    with open(path) as f:
        return [json.loads(line)["startup"] for line in f if '"startup"' in line]


class Throughput:
    """Samples and steps per second over a window of steps, and over the whole session."""

    def __init__(self) -> None:
        self.session_start = time.perf_counter()
        self.window_start = self.session_start
        self.window_samples = 0
        self.session_samples = 0
        self.session_steps = 0

    def add(self, samples: int) -> None:
        self.window_samples += samples
        self.session_samples += samples
        self.session_steps += 1

    def window_rate(self) -> float:
        now = time.perf_counter()
        rate = self.window_samples / max(now - self.window_start, 1e-9)
        self.window_start, self.window_samples = now, 0
        return rate

    def session(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.session_start, 1e-9)
        return {
            "train_time_s": elapsed,
            "samples_per_s": self.session_samples / elapsed,
            "steps_per_s": self.session_steps / elapsed,
        }


SHOWN = ("step", "epoch", "loss", "grad_norm", "lr", "samples_per_s", "test_loss", "test_accuracy")


def progress_line(metrics: dict[str, Any]) -> str:
    """The line rank 0 prints at each report: the metrics a person watches, in a fixed order."""

    def fmt(key: str, value: Any) -> str:
        return f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"

    return "[raydist] " + " ".join(fmt(k, metrics[k]) for k in SHOWN if k in metrics)
