"""What an async PS session shows and writes while it trains, over all its starts of the actors."""

from __future__ import annotations

import time
from typing import Any

from raydist.config import Config
from raydist.observability.console import ProgressBar
from raydist.observability.tensorboard_log import RunLog
from raydist.strategies.async_ps.messages import Drained


class Progress:
    """The session's course: the steps done, every update record (metrics.jsonl and TensorBoard, `log`), the progress
    bar, the newest losses and test scores. It outlives restarts; a restart takes it back to its checkpoint's step."""

    def __init__(self, cfg: Config, log: RunLog, bar: ProgressBar, steps: int):
        self.cfg, self.log, self.bar = cfg, log, bar
        self.steps = steps
        self.t0: float | None = None  # time.time() when training began; metrics' time_s and train_time_s count from it
        self.train_time_s = 0.0  # from t0 until the workers of the last start ended
        self.window: list[dict[str, Any]] = []  # update records of the current progress window (train.report_every_s)
        self.last_losses: list[float] = []  # the newest loss of up to one step per worker
        self.scores = {"test_loss": float("nan"), "test_accuracy": float("nan")}

    def take(self, drained: Drained) -> None:
        """Shard 0's drain: the steps done, and the update records since the last one, written and windowed."""
        self.steps = drained.steps_done
        for r in drained.records:
            self.log.write(r)
        self.window.extend(drained.records)
        if drained.records:
            self.last_losses = ([r["loss"] for r in drained.records] + self.last_losses)[: self.cfg.scaling.max_workers]

    def scored(self, scores: dict[str, float]) -> None:
        self.scores = scores
        self.log.write({"eval_at_step": self.steps, "time_s": time.time() - self.t0, **scores})

    def show(self) -> None:
        """The shared progress bar (raydist.observability.console): step of the budget, loss and staleness over the current
        window, the latest test accuracy, samples/s, ETA."""
        applied = [r["staleness"] for r in self.window if "step" in r]
        loss = sum(r["loss"] for r in self.window) / len(self.window) if self.window else None
        accuracy = self.scores["test_accuracy"]
        self.bar.update(
            self.steps,
            loss=loss,
            test_accuracy=None if accuracy != accuracy else accuracy,
            extra={"staleness": f"{sum(applied) / len(applied):.3g}"} if applied else None,
        )

    def report(self) -> None:
        """A plain line about every train.report_every_s with run.verbose; a new window either way."""
        if self.cfg.run.verbose:
            print(self.bar.plain_line(), flush=True)
        self.window.clear()

    def restarted(self, steps: int) -> None:
        self.steps = steps
        self.log.restart(steps)  # TensorBoard hides the failed attempt's points after that checkpoint

    def final_loss(self) -> float | None:
        return sum(self.last_losses) / len(self.last_losses) if self.last_losses else None

    def close(self, completed: bool) -> None:
        self.bar.close(completed=completed)
        self.log.close()
