"""TensorBoard event files for a run: the records metrics.jsonl gets, as scalars, from one writer per run.

`RunLog` is a `MetricsLog` that also hands every record to `TensorBoardLog`, so the training loop and the async
driver feed both with the calls they already make. Files go to `<run dir>/tensorboard/`, so compare's
`<output>/runs/<strategy>/tensorboard` lets one `tensorboard --logdir <output>/runs` show every strategy.

Tags (stable; docs/running.md#tensorboard lists them):

- per step: `train/loss`, `train/grad_norm`, `train/lr`, `train/step_time_s`, and a strategy's own (`Metric.per_step`:
  the async PS's `train/staleness`)
- about once a second of training: `train/samples_per_s` (global samples over wall-clock time between records)
- per evaluation: `eval/test_loss`, `eval/test_accuracy`
- per session, at the step it starts from: the resolved config as text (`config`), and `run/world_size` (the
  Ray Train strategies, whose worker count can change on an elastic restart)
"""

from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING, Any

import yaml

from raydist.errors import RaydistError
from raydist.observability import ray_metrics
from raydist.observability.metrics import MetricsLog

if TYPE_CHECKING:
    from raydist.config import Config

TENSORBOARD_DIR = "tensorboard"
TRAIN_KEYS = ("loss", "grad_norm", "lr", "step_time_s", *(m.name for m in ray_metrics.METRICS if m.per_step))
"""Per-step record fields written as `train/<key>` (those a record has): the common ones and a strategy's own."""
EVAL_KEYS = ("test_loss", "test_accuracy")
CONFIG_TAG = "config"
RATE_WINDOW_S = 1.0
"""`train/samples_per_s` spans at least this much of the run's time: per step it would be timer noise."""
FLUSH_S = 5
"""The writer's thread writes queued events out this often, so a live `tensorboard` sees a run within seconds."""


def tensorboard_dir(run_dir: str) -> str:
    return os.path.join(run_dir, TENSORBOARD_DIR)


class TensorBoardLog:
    """One session's event writer. Steps after `start_step` that an earlier session (or attempt) wrote are purged
    from view: a session resumed from the checkpoint at step S redoes the steps from S + 1, so their old points,
    written before a failure, would otherwise stay next to the new ones."""

    def __init__(
        self, run_dir: str, start_step: int, config: dict[str, Any] | None = None, samples_per_step: int | None = None
    ):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch raises this when the tensorboard package is missing
            raise RaydistError(
                f"run.tensorboard needs the tensorboard package ({e}); pip install tensorboard, "
                "or --set run.tensorboard=false"
            ) from None
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._Summary = Summary
        self.directory = tensorboard_dir(run_dir)
        self.samples_per_step = samples_per_step
        self._SummaryWriter = SummaryWriter
        self._writer = self._open(start_step)
        self._window: tuple[int, float] | None = None  # (step, time_s) where the samples/s window began
        if config is not None:
            self._config(config, start_step)

    def _open(self, start_step: int) -> Any:
        # A new event file whose first event tells readers to drop the points after start_step from earlier files.
        return self._SummaryWriter(self.directory, purge_step=start_step + 1, flush_secs=FLUSH_S, max_queue=1000)

    # One event per record, however many values it carries: an event costs ~25 us on the writer's thread (its
    # CRC is pure Python), the values in it next to nothing.
    def _scalars(self, values: dict[str, float], step: int) -> None:
        summary = self._Summary(value=[self._Summary.Value(tag=tag, simple_value=v) for tag, v in values.items()])
        self._writer.file_writer.add_summary(summary, step)

    def _config(self, config: dict[str, Any], step: int) -> None:
        # Indented, TensorBoard's markdown renders it as a code block with the YAML's layout kept.
        text = yaml.safe_dump(json.loads(json.dumps(config)), sort_keys=False)
        self._writer.add_text(CONFIG_TAG, "".join(f"    {line}\n" for line in text.splitlines()), step)

    def write(self, record: dict[str, Any]) -> None:
        """A metrics.jsonl record: a step, an evaluation or a session start; others (dropped updates) are skipped."""
        if "step" in record:
            step = record["step"]
            self._scalars({f"train/{k}": float(record[k]) for k in TRAIN_KEYS if record.get(k) is not None}, step)
            self._rate(step, record.get("time_s"))
        elif "eval_at_step" in record:
            self._scalars(
                {f"eval/{k}": float(record[k]) for k in EVAL_KEYS if record.get(k) is not None}, record["eval_at_step"]
            )
        elif "session_at_step" in record:
            self.samples_per_step = record.get("samples_per_step", self.samples_per_step)
            self._window = None  # time_s starts again with each session
            if "world_size" in record:
                self._scalars({"run/world_size": float(record["world_size"])}, record["session_at_step"])

    def _rate(self, step: int, time_s: float | None) -> None:
        if time_s is None or not self.samples_per_step:
            return
        if self._window is None:
            self._window = (step, time_s)
            return
        first, since = self._window
        elapsed = time_s - since
        if elapsed >= RATE_WINDOW_S and step > first and math.isfinite(elapsed):
            self._scalars({"train/samples_per_s": self.samples_per_step * (step - first) / elapsed}, step)
            self._window = (step, time_s)

    def restart(self, start_step: int) -> None:
        """The run went back to the checkpoint at `start_step` (the async driver after a failure): hide the points
        of the steps after it that the failed attempt wrote."""
        self._writer.close()
        self._writer = self._open(start_step)
        self._window = None

    def flush(self) -> None:
        """Wait until everything written so far is in the file (at a checkpoint: the points up to its step must
        outlive a worker killed after it, since a resumed session hides only those after it)."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class RunLog(MetricsLog):
    """metrics.jsonl, and the same records as TensorBoard events unless run.tensorboard is off. Pass the step the
    session starts from (its checkpoint's step, or 0); `samples_per_step` when no session record will say it."""

    def __init__(self, cfg: Config, enabled: bool, start_step: int, samples_per_step: int | None = None):
        super().__init__(cfg.run.run_dir, enabled)
        self.board: TensorBoardLog | None = None
        if enabled and cfg.run.tensorboard:
            self.board = TensorBoardLog(cfg.run.run_dir, start_step, cfg.to_dict(), samples_per_step)

    def write(self, record: dict[str, Any]) -> None:
        super().write(record)
        if self.board is not None:
            self.board.write(record)

    def restart(self, start_step: int) -> None:
        if self.board is not None:
            self.board.restart(start_step)

    def flush(self) -> None:
        if self.board is not None:  # metrics.jsonl is line-buffered: each record is in the file already
            self.board.flush()

    def close(self) -> None:
        super().close()
        if self.board is not None:
            self.board.close()
