"""The one worker-side training loop: every Ray Train strategy (sync DDP, local SGD, ...) runs this `Trainer`.

The loop owns the run's shape: data shard, progress, the straggler hook, and the step boundary at which a run
stops. It acts; its parts decide or keep what is theirs: `raydist.train.schedule` says when a report, an evaluation,
a checkpoint, a desync check or a stop poll is due, `restore.Restorer` reads and writes checkpoints in the layout
the strategy needs, `report.Reporter` feeds metrics.jsonl, TensorBoard, Ray's metrics and Ray Train's report,
`desync.Watch` judges the replicas' fingerprints and `votes.Stops` the stop requests. A `Strategy` supplies only how
the model is wrapped and what it exchanges, and when (its sync points), plus the capabilities it declares.

Everything collective happens at sync points, where every rank is at the same step: one small all-reduce
(`votes.Votes`) carries the loss, rank 0's "time to report" vote and every rank's stop vote, so all ranks take the
same decisions without clocks of their own. Sync DDP is at a sync point every step; local SGD every H steps.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch

from raydist.config import Config
from raydist.torchkit.checkpoint import Progress
from raydist.torchkit.commstats import CommStats
from raydist.torchkit.data import load_splits
from raydist.torchkit.models import build_model
from raydist.torchkit.optim import build_optimizer, build_scheduler
from raydist.torchkit.sharding import total_steps as run_length
from raydist.torchkit.sharding import worker_shard
from raydist.torchkit.straggler import Straggler
from raydist.train import desync
from raydist.train.collectives import Collectives
from raydist.train.context import WorkerContext
from raydist.train.evaluation import evaluate
from raydist.train.report import Reporter, run_totals
from raydist.train.restore import Restorer, TrainState
from raydist.train.schedule import Cadence, Due, Every, Schedule
from raydist.train.step import compute_gradients
from raydist.train.strategy import FaultTolerant, Strategy
from raydist.train.votes import Stops, Votes


@dataclass
class _Step:
    """One optimizer step as the loop saw it on this rank."""

    record: dict[str, Any]
    """Its metrics.jsonl record."""
    loss_sum: torch.Tensor
    grad_norm: torch.Tensor
    at_end: bool
    """The run's last step."""
    stop_at: bool
    """train.stop_at_step is reached."""


class Trainer:
    """Train one strategy on this worker from the latest checkpoint to the configured step count."""

    def __init__(self, cfg: Config, ctx: WorkerContext, strategy: type[Strategy], entered: float | None = None):
        entered = time.time() if entered is None else entered  # the `startup` record's start
        self.cfg, self.ctx = cfg, ctx
        self.comm = CommStats()
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.data = load_splits(cfg.data)
        model = build_model(cfg.model, self.data).to(ctx.device)
        self.strategy = strategy(cfg, ctx, self.comm)
        self.forward_model = self.strategy.wrap(model)
        self.coll = (
            self.strategy.collectives()
            if isinstance(self.strategy, FaultTolerant)
            else Collectives(ctx.world_size, ctx.rank)
        )
        """The group of the loop's own collectives (a fault-tolerant strategy's own; torch.distributed's default)."""
        optimizer = build_optimizer(model.parameters(), cfg.optim)
        self.shard = worker_shard(self.data.train, cfg, ctx.rank, ctx.world_size, loader_seed=cfg.train.seed)
        self.total_steps = run_length(cfg, self.shard.steps_per_epoch)
        scheduler = build_scheduler(optimizer, self.total_steps, cfg.schedule)
        self.state = TrainState(model, optimizer, scheduler, Progress())
        self.restorer = Restorer(cfg, ctx, self.strategy, self.coll, self.state)
        # A replacement that takes the state from a live peer (in its first step) reads no checkpoint.
        self.from_peer = isinstance(self.strategy, FaultTolerant) and self.strategy.share_state(
            self._live_state, self._take_live_state, lambda: self.state.progress, self.total_steps
        )
        self.resumed_from = None if self.from_peer else self.restorer.restore()
        self.schedule = self._fresh_schedule()
        """When to report, evaluate, checkpoint, check for desync and poll for a stop; rank 0's clock decides the
        timed ones for every rank (through the sync point's all-reduce)."""
        self.stops = Stops(ctx, cfg.train.stop_at_step)
        self.stop_requests = self.stops.requests
        """Callables polled for a reason to stop at the next sync point (`Stops.requests`)."""
        self.desync = desync.Watch(cfg, ctx.rank, self.strategy, fresh=self.resumed_from is None)
        self.aborted: str | None = None
        """Why the run must end as failed with no checkpoint after the last good one (a desync, on_desync=stop)."""
        self.report = Reporter(cfg, ctx, self.strategy.name, self.state.progress.step, entered)
        self.straggler = Straggler(cfg.straggler, ctx.rank)

    # ---- state a live peer hands over -------------------------------------------------------------

    def _fresh_schedule(self) -> Schedule:
        cfg = self.cfg
        cadence = Cadence(
            report_every_s=cfg.train.report_every_s,
            checkpoint=Every(cfg.checkpoint.every_steps),
            desync=Every(cfg.faults.desync_every_steps),
        )
        return Schedule.starting(cadence, self.state.progress.step, time.perf_counter(), self._epochs_done())

    def _live_state(self) -> dict[str, Any]:
        return {**self.restorer.live_state(), "schedule": self.schedule.steps_done()}

    def _take_live_state(self, state: dict[str, Any]) -> None:
        self.restorer.take_live_state(state)
        self.schedule = self._fresh_schedule()
        self.schedule.take_steps_done(state["schedule"])  # what is due next, as the peer sees it

    # ---- the loop ----------------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """Train to the end (or a stop); returns the last metrics reported."""
        self.report.announce(self.resumed_from, self.total_steps, self.shard.steps_per_epoch, self.strategy.describe)
        self.report.session(self.state.progress.step, self.total_steps, self.from_peer)
        window = torch.zeros(2, device=self.ctx.device)  # loss sum and steps since the last report
        peer_lost = self.strategy.peer_lost if isinstance(self.strategy, FaultTolerant) else ()
        first_step, last = True, {}
        for micro_batches in self.shard.steps(self.state.progress, self.cfg.train.grad_accum, self._finished):
            step = self._train_step(micro_batches)
            if step is None:
                continue
            window += torch.stack([step.loss_sum.float(), torch.ones((), device=self.ctx.device)])
            self.report.counted(self.comm, first_step, self.from_peer)
            first_step = False
            if not self.strategy.is_sync_point(self.state.progress.step, final=step.at_end or step.stop_at):
                self.report.step(step.record, self.total_steps)
                continue
            try:
                metrics = self._sync_point(step, window)
            except peer_lost as lost:  # nothing was reported; training goes on without the peer
                print(
                    f"[raydist] {self.strategy.name}: step {self.state.progress.step}'s report dropped: {lost}",
                    flush=True,
                )
                continue
            if self.aborted:
                break
            last = metrics or last
        # A run resumed at its very end takes no step and reports nothing: its last checkpoint already holds the
        # final metrics, which Ray Train returns as the result.
        self.strategy.close()
        self.report.close(last, self.restorer.saved_at)
        return last

    def _finished(self) -> bool:
        step = self.state.progress.step
        return self.stops.stopped or step >= self.total_steps or self.stops.at_limit(step)

    def _epochs_done(self) -> int:
        """Epochs of this rank's data completed: the last step of an epoch counts it before the data rolls over."""
        p = self.state.progress
        return p.epoch + int(p.micro_in_epoch >= self.shard.steps_per_epoch * self.cfg.train.grad_accum)

    def _train_step(self, micro_batches: list) -> _Step | None:
        """Forward, backward, the strategy's hooks and the optimizer: one step on this rank; None when the strategy
        did not commit it (its gradients are dropped, and the step is taken again on the next batch)."""
        cfg, s, strategy = self.cfg, self.state, self.strategy
        p = s.progress
        t0 = time.perf_counter()
        self.desync.measure(self.schedule.desync_due(p.step + 1))
        loss_sum = compute_gradients(self.forward_model, micro_batches, cfg, self.ctx.device, strategy.micro_step)
        strategy.after_backward(p.step)
        grad_norm = strategy.clip_grad_norm(cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf)
        if isinstance(strategy, FaultTolerant) and not strategy.commit():
            strategy.zero_grad(s.optimizer)
            return None
        lr = s.scheduler.get_last_lr()[0]
        s.optimizer.step()
        self.desync.inject(s.model, p.step + 1)
        s.scheduler.step()
        strategy.zero_grad(s.optimizer)
        self.straggler.after_step(p.step + 1, time.perf_counter() - t0)
        p.step += 1
        p.micro_in_epoch += cfg.train.grad_accum
        strategy.after_step(p.step)
        record = self.report.record(p.step, p.epoch, loss_sum, grad_norm, lr, began=t0)
        return _Step(
            record, loss_sum, grad_norm, at_end=p.step >= self.total_steps, stop_at=self.stops.at_limit(p.step)
        )

    def _sync_point(self, step: _Step, window: torch.Tensor) -> dict[str, Any] | None:
        """Every rank is here, at this step: agree on what is due (one all-reduce), check for desync, decide on a
        stop, then report (evaluate, checkpoint) if due. Returns the metrics reported, None if nothing was."""
        p = self.state.progress
        due = self.schedule.due(p.step, time.perf_counter(), epochs=self._epochs_done(), final=step.at_end)
        votes = self._vote(step, window, due)
        if self.strategy.global_step_loss():
            step.record["loss"] = votes.step_loss()
        self.report.step(step.record, self.total_steps)
        if due.desync_check:
            self.schedule.checked_desync(p.step)
            verdict = self.desync.verdict(votes.fingerprints(), step.at_end, p.step, self.schedule.last_checkpoint)
            if verdict and verdict.restart:
                raise desync.DesyncError(verdict.why)
            if verdict:
                self.aborted = verdict.why
                return None
        if votes.polled():
            self.schedule.polled(time.perf_counter())
        stopping = self.stops.agree(votes.polled(), votes.stop(), p.step, step.at_end)
        due = replace(due, report=votes.report())  # rank 0's clock decides for every rank
        if stopping:
            due = due.ending()
        if not due.reports:
            return None
        return self._report(step, window, votes, due)

    def _vote(self, step: _Step, window: torch.Tensor, due: Due) -> Votes:
        """The strategy's exchange, then the sync point's one all-reduce: the loss window, rank 0's report and stop
        votes and, when a desync check is due, every rank's fingerprint."""
        ctx = self.ctx
        votes = Votes(ctx.world_size, ctx.device, window, step.loss_sum)
        if ctx.rank == 0 and due.report:
            votes.vote_report()
        if ctx.rank == 0 and due.stop_poll:
            votes.vote_poll(stop=self.stops.poll())
        with self.comm.waiting():  # where the others wait for a straggler
            self.strategy.synchronize(final=step.at_end)
        if due.desync_check:  # this rank's fingerprint rides on the same all-reduce
            votes.fingerprint(ctx.rank, *self.desync.fingerprint(self.state.model, step.grad_norm))
        with self.comm.waiting():
            votes.count(self.coll)
        return votes

    def _report(self, step: _Step, window: torch.Tensor, votes: Votes, due: Due) -> dict[str, Any]:
        """Report this step's metrics to Ray Train (with a checkpoint when one is due), evaluating first if due."""
        p = self.state.progress
        self.schedule.reported(time.perf_counter())
        metrics = self.report.metrics(step.record, votes.mean_loss())
        window.zero_()
        if due.evaluate:
            metrics.update(self._evaluate(step))
        if due.final:  # collectives: every rank is here
            metrics.update(
                run_totals(
                    self.coll, self.comm, self.strategy, self.state.model, str(self.ctx.device), self.total_steps
                )
            )
            if not step.at_end:  # a stop
                metrics["stop_reason"] = self.stops.reason
                if self.ctx.rank == 0:
                    print(f"[raydist] {self.strategy.name}: stopping at step {p.step}: {self.stops.reason}", flush=True)
        if self.resumed_from is not None:
            metrics["resumed_from_step"] = self.resumed_from
        metrics.update(self.report.session_metrics())
        self.report.show(metrics)
        if due.checkpoint:
            self.report.before_checkpoint()
            seconds = self.restorer.save(metrics)
            self.schedule.checkpointed(p.step)
            self.report.checkpointed(p.step, seconds)
        else:
            self.report.to_ray_train(metrics, p.step)
        return metrics

    def _evaluate(self, step: _Step) -> dict[str, Any]:
        model = self.strategy.eval_model(final=step.at_end)
        scores = evaluate(model, self.data, self.cfg, self.ctx, self.coll.all_reduce)
        self.report.evaluated(self.state.progress.step, step.record["time_s"], scores)
        self.schedule.evaluated(self._epochs_done())
        return scores
