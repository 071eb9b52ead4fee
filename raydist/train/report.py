"""Where the loop's numbers go: metrics.jsonl and TensorBoard (rank 0's `RunLog`), the metrics every rank exports
through Ray (`Exporter`), Ray Train's report, the verbose progress line and the final result file.

The loop says what happened (a step, a sync point's report, an evaluation, a checkpoint); the `Reporter` times the
throughput and writes each sink. It takes no decisions: what is due is the schedule's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from raydist.config import Config
from raydist.observability.metrics import Throughput, progress_line
from raydist.observability.ray_metrics import Exporter, peak_memory_bytes
from raydist.observability.tensorboard_log import RunLog
from raydist.torchkit.commstats import CommStats, per_worker_summary
from raydist.train.collectives import Collectives
from raydist.train.context import WorkerContext
from raydist.train.result import write_final_result
from raydist.train.strategy import FinalMetrics, Strategy, held_param_bytes


class Reporter:
    """One session's sinks, and the throughput and times they report."""

    def __init__(self, cfg: Config, ctx: WorkerContext, strategy_name: str, start_step: int, entered: float):
        self.cfg, self.ctx, self.strategy_name = cfg, ctx, strategy_name
        self.log = RunLog(cfg, enabled=ctx.rank == 0, start_step=start_step)  # metrics.jsonl and TensorBoard
        self.speed = Throughput()
        self.export = Exporter(cfg.run.name, strategy_name, "worker", ctx.rank, device=str(ctx.device))
        self.entered = entered
        """Wall time this worker's training function began (the `startup` record of metrics.jsonl)."""
        self.ready: float | None = None
        self.samples_per_step = cfg.train.batch_size * cfg.train.grad_accum * ctx.world_size

    def announce(
        self, resumed_at: int | None, total_steps: int, steps_per_epoch: int, describe: Callable[[], str]
    ) -> None:
        """Rank 0's start line (`describe`: the strategy's words for it)."""
        if self.ctx.rank != 0:
            return
        where = f"resuming at step {resumed_at}" if resumed_at is not None else "starting"
        backend = dist.get_backend() if dist.is_initialized() else "none"
        extra = describe()
        print(
            f"[raydist] {self.strategy_name}: {where}; {total_steps} steps, {steps_per_epoch}/epoch, "
            f"{self.ctx.world_size} workers, global batch {self.samples_per_step}, backend {backend}"
            f"{'; ' + extra if extra else ''}",
            flush=True,
        )

    def session(self, step: int, total_steps: int, from_peer: bool) -> None:
        """Where this session starts and what a step is worth: the driver's progress bar follows metrics.jsonl."""
        self.log.write(
            {
                "session_at_step": step,
                "total_steps": total_steps,
                "world_size": self.ctx.world_size,
                "samples_per_step": self.samples_per_step,
                "strategy": self.strategy_name,
                "from_peer": from_peer,
            }
        )
        self.ready = time.time()

    def record(
        self, step: int, epoch: int, loss_sum: torch.Tensor, grad_norm: torch.Tensor, lr: float, began: float
    ) -> dict[str, Any]:
        """A step this rank took (`began`: its perf_counter start): its metrics.jsonl record."""
        self.speed.add(self.samples_per_step)
        now = time.perf_counter()
        return {
            "step": step,
            "epoch": epoch,
            "loss": loss_sum.item(),  # this rank's; replaced by the global loss where there is one
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "step_time_s": now - began,
            "time_s": now - self.speed.session_start,
        }

    def counted(self, comm: CommStats, first: bool, from_peer: bool) -> None:
        """A step is done; the first of the session says where its start-up went (wall clock: the driver subtracts
        its own start)."""
        if first:
            self.log.write(
                {
                    "startup": {
                        "worker_entered": self.entered,
                        "ready": self.ready,
                        "first_step": time.time(),
                        "from_peer": from_peer,
                    }
                }
            )
        self.export.count("samples_per_s", self.samples_per_step / self.ctx.world_size)
        self.export.communication(comm.bytes, comm.wait_s)

    def step(self, record: dict[str, Any], total_steps: int) -> None:
        self.log.write(record)
        self.export.observe(
            step=record["step"],
            total_steps=total_steps,
            loss=record["loss"],
            grad_norm=record["grad_norm"],
            lr=record["lr"],
            step_time_s=record["step_time_s"],
        )
        self.export.maybe_export()

    def metrics(self, record: dict[str, Any], mean_loss: float) -> dict[str, Any]:
        """A sync point's report: the step's record with the loss over the steps since the last report."""
        return {**record, "loss": mean_loss, "samples_per_s": self.speed.window_rate(), "strategy": self.strategy_name}

    def evaluated(self, step: int, time_s: float, scores: dict[str, Any]) -> None:
        self.log.write({"eval_at_step": step, "time_s": time_s, **scores})
        self.export.observe(test_accuracy=scores.get("test_accuracy"))

    def session_metrics(self) -> dict[str, float]:
        return self.speed.session()

    def show(self, metrics: dict[str, Any]) -> None:
        if self.ctx.rank == 0 and self.cfg.run.verbose:  # else the driver's progress bar shows them
            print(progress_line(metrics), flush=True)

    def to_ray_train(self, metrics: dict[str, Any], step: int) -> None:
        self.ctx.report(metrics, None, step)

    def before_checkpoint(self) -> None:
        self.log.flush()  # TensorBoard's points so far on disk before a checkpoint a resume starts after

    def checkpointed(self, step: int, seconds: float) -> None:
        self.export.observe(checkpoint_s=seconds, last_checkpoint_step=step)

    def close(self, last: dict[str, Any], checkpointed_at: int | None) -> None:
        self.log.close()
        self.export.maybe_export(force=True)
        if self.ctx.rank == 0 and last and self.ctx.fit_id:
            write_final_result(self.cfg.run.run_dir, self.ctx.fit_id, last, checkpointed_at)


def run_totals(
    coll: Collectives, comm: CommStats, strategy: Strategy, model: torch.nn.Module, device: str, total_steps: int
) -> dict[str, Any]:
    """The run's totals at its last sync point: every rank's communication, peak memory (GPU: allocated by torch;
    CPU: the process's peak resident set) and the parameter bytes it holds, in rank order, and the strategy's own
    summary fields. Collectives: every rank calls it."""
    comms = per_worker_summary(coll.all_gather_object(comm.as_dict()))
    memory = coll.all_gather_object((peak_memory_bytes(device), held_param_bytes(model)))
    totals = {
        "comm": comms,
        "memory": {
            "peak_memory_bytes_per_worker": [int(p) for p, _ in memory],
            "param_bytes_per_worker": [int(b) for _, b in memory],
        },
        "total_steps": total_steps,
        "world_size": coll.world_size,
    }
    if isinstance(strategy, FinalMetrics):
        totals.update(strategy.final_metrics(coll))
    return totals
