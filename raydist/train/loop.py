"""The one worker-side training loop: every Ray Train strategy (sync DDP, local SGD, ...) runs this `Trainer`.

The loop owns the run's shape: data shard, progress and resume, metrics, the straggler hook, and the step boundary
at which a run stops. `raydist.train.schedule` says when a report, an evaluation, a checkpoint, a desync check or a stop
poll is due; the loop acts on it where it can. A `Strategy` supplies only how the model is wrapped and what it
exchanges, and when (its sync points).

Everything collective happens at sync points, where every rank is at the same step: one small all-reduce
carries the loss, rank 0's "time to report" vote and every rank's stop vote, so all ranks take the same
decisions without clocks of their own. Sync DDP is at a sync point every step; local SGD every H steps.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.distributed as dist

from raydist.torchkit.checkpoint import Progress, load_replica, load_state, rng_state, save_replica, save_state, set_rng_state
from raydist.torchkit.commstats import CommStats, per_worker_summary
from raydist.config import Config
from raydist.errors import RaydistError
from raydist.train.context import WorkerContext, new_checkpoint_dir
from raydist.torchkit.data import load_splits
from raydist.train.evaluation import evaluate
from raydist.train.result import write_final_result
from raydist.observability.metrics import Throughput, progress_line
from raydist.torchkit.models import build_model
from raydist.observability.ray_metrics import Exporter, peak_memory_bytes
from raydist.torchkit.optim import build_optimizer, build_scheduler
from raydist.train.schedule import Cadence, Due, Every, Schedule
from raydist.torchkit.seeding import reseed
from raydist.torchkit.sharding import total_steps as run_length, worker_shard
from raydist.torchkit.straggler import Straggler
from raydist.observability.tensorboard_log import RunLog
from raydist.train import desync
from raydist.train.step import compute_gradients
from raydist.train.collectives import Collectives
from raydist.train.strategy import (DesyncCheck, FaultTolerant, FinalMetrics, PerRankState, ShardedState, Strategy,
                                   held_param_bytes, local_tensor)

# Slots of the all-reduce every sync point runs.
_LOSS_SUM, _LOSS_STEPS, _STEP_LOSS, _REPORT_VOTE, _POLL_VOTE, _STOP_VOTE = range(6)
_FINGERPRINTS = 6  # then desync.SLOTS per rank, filled at a desync check


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
        self.entered = time.time() if entered is None else entered
        """Wall time this worker's training function began (the `startup` record of metrics.jsonl)."""
        self.cfg, self.ctx = cfg, ctx
        self.comm = CommStats()
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.data = load_splits(cfg.data)
        self.model = build_model(cfg.model, self.data).to(ctx.device)
        self.strategy = strategy(cfg, ctx, self.comm)
        self.forward_model = self.strategy.wrap(self.model)
        self.coll = (self.strategy.collectives() if isinstance(self.strategy, FaultTolerant)
                     else Collectives(ctx.world_size, ctx.rank))
        """The group of the loop's own collectives (the strategy's: torch.distributed's default one for most)."""
        self.optimizer = build_optimizer(self.model.parameters(), cfg.optim)
        self.shard = worker_shard(self.data.train, cfg, ctx.rank, ctx.world_size, loader_seed=cfg.train.seed)
        self.total_steps = run_length(cfg, self.shard.steps_per_epoch)
        self.scheduler = build_scheduler(self.optimizer, self.total_steps, cfg.schedule)
        self.progress = Progress()
        self.micro_per_epoch = self.shard.steps_per_epoch * cfg.train.grad_accum
        self.cadence = Cadence(report_every_s=cfg.train.report_every_s, checkpoint=Every(cfg.checkpoint.every_steps),
                               desync=Every(cfg.faults.desync_every_steps))
        # A replacement that takes the state from a live peer (in its first step) reads no checkpoint.
        from_peer = isinstance(self.strategy, FaultTolerant) and self.strategy.share_state(
            self._live_state, self._take_live_state, lambda: self.progress, self.total_steps)
        self.resumed_from = None if from_peer else self._restore()
        self.from_peer = from_peer
        self.checkpointed_at: int | None = None  # the step of this session's newest checkpoint
        self.schedule = Schedule.starting(self.cadence, self.progress.step, time.perf_counter(), self._epochs_done())
        """When to report, evaluate, checkpoint, check for desync and poll for a stop; rank 0's clock decides the
        timed ones for every rank (through the sync point's all-reduce)."""
        self.stop_requests: list[Callable[[], str | None]] = [ctx.stop_request]
        """Polled on rank 0 about every raydist.train.schedule.STOP_POLL_S, at a sync point; the first reason any returns
        makes every rank checkpoint there and stop (the preemption and desync checks hook in here)."""
        self.stop_reason: str | None = None
        self._stopped = False
        self.aborted: str | None = None
        """Why the run must end as failed with no checkpoint after the last good one (a desync, on_desync=stop)."""
        self.log = RunLog(cfg, enabled=ctx.rank == 0, start_step=self.progress.step)  # metrics.jsonl and TensorBoard
        self.speed = Throughput()
        self.straggler = Straggler(cfg.straggler, ctx.rank)
        self.export = Exporter(cfg.run.name, strategy.name, "worker", ctx.rank, device=str(ctx.device))

    # ---- resume ----------------------------------------------------------------------------------

    def _restore(self) -> int | None:
        """Load the latest checkpoint if the run has one; returns the step it resumes from, or None."""
        with self.ctx.latest_checkpoint() as directory:
            if directory is None:
                return None
            state = load_state(directory)
            extra = state["extra"]
            rank, same_world = self.ctx.rank, extra["world_size"] == self.ctx.world_size
            replicas = extra.get("replicas", 0)  # every rank wrote its own model and optimizer (save_replica)
            sharded = state["model"] is None and not replicas  # a sharded strategy's ranks wrote their parts
            if sharded != isinstance(self.strategy, ShardedState):
                raise RaydistError(
                    f"checkpoint {os.path.basename(os.path.normpath(directory))} holds a "
                    f"{'sharded' if sharded else 'full'} model written by {extra.get('strategy_name')}, which "
                    f"{self.strategy.name} cannot resume from: use a new run.name")
            if sharded:  # every rank reads its part while the directory is at hand (DCP reshards for another W)
                self.strategy.load_sharded(directory, self.optimizer)
            elif replicas:  # each rank takes back its own; another world size, or one model for all: rank 0's
                mine = load_replica(directory, rank if same_world and isinstance(self.strategy, PerRankState) else 0)
                self.model.load_state_dict(mine["model"])
                self.optimizer.load_state_dict(mine["optimizer"])
        if not (sharded or replicas):  # one model for all (an older local SGD checkpoint: rank 0's)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.strategy.load_state_dict(extra.get("strategy", {}), same_world)
        self.progress = state["progress"]
        if same_world:
            set_rng_state(state["rng_per_rank"][rank])
        else:  # a different worker count changes the sample order anyway: only reseed
            reseed(self.cfg.train.seed, rank, self.progress.step)
        return self.progress.step

    def _live_state(self) -> dict[str, Any]:
        """What a replacement worker takes from a live peer to go on in step with it (`Strategy.share_state`)."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "strategy": self.strategy.state_dict(),
                "progress": dataclasses.asdict(self.progress), "schedule": self.schedule.steps_done()}

    def _take_live_state(self, state: dict[str, Any]) -> None:
        """A peer's `_live_state`, taken in the middle of a step: progress is changed in place, where the data
        iterator reads it."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.strategy.load_state_dict(state["strategy"], same_world=True)
        for key, value in state["progress"].items():
            setattr(self.progress, key, value)
        self.schedule = Schedule.starting(self.cadence, self.progress.step, time.perf_counter(), self._epochs_done())
        self.schedule.take_steps_done(state["schedule"])  # what is due next, as the peer sees it

    def _checkpoint(self, metrics: dict[str, Any]) -> None:
        """Every rank calls it at the same sync point; each writes its own part if the strategy has one, rank 0 the
        rest and the manifest, then all report it to Ray Train together."""
        W = self.ctx.world_size
        rngs = self.coll.all_gather_object(rng_state())
        directory = None
        began = time.perf_counter()
        sharded, per_rank = isinstance(self.strategy, ShardedState), isinstance(self.strategy, PerRankState)
        if sharded or per_rank:  # every rank writes its part into one directory on the run's shared storage
            directory = self._shared_staging_dir()
            if sharded:
                self.strategy.save_sharded(directory, self.optimizer)
            else:
                save_replica(directory, self.ctx.rank, self.model, self.optimizer)
                self.coll.barrier()  # every replica's file is written before rank 0's manifest
        if self.ctx.rank == 0:
            self.log.flush()  # TensorBoard's points so far on disk before a checkpoint a resume starts after
            directory = directory or new_checkpoint_dir()
            extra = {"config": self.cfg.to_dict(), "world_size": W, "strategy_name": self.strategy.name,
                     "strategy": self.strategy.state_dict(), **({"replicas": W} if per_rank else {})}
            # Last: the manifest then covers every rank's files (all written by now).
            own = not (sharded or per_rank)
            save_state(directory, model=self.model if own else None, optimizer=self.optimizer if own else None,
                       scheduler=self.scheduler, progress=self.progress, rng_per_rank=rngs, extra=extra)
        self.ctx.report(metrics, directory if self.ctx.rank == 0 else None, self.progress.step,
                        on_storage=sharded or per_rank)
        self.schedule.checkpointed(self.progress.step)
        self.checkpointed_at = self.progress.step
        self.export.observe(checkpoint_s=time.perf_counter() - began, last_checkpoint_step=self.progress.step)

    def _shared_staging_dir(self) -> str:
        """Where every rank writes its part of this step's checkpoint: in the run directory, which all ranks share
        (a temp directory is node-local). Rank 0 empties it of a killed save's leftovers before anyone writes; the
        finished directory is then renamed into place and recorded where it is (`report(on_storage=True)`)."""
        path = os.path.join(self.cfg.run.run_dir, f".staging-checkpoint_step{self.progress.step:08d}")
        if self.ctx.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
        self.coll.barrier()
        return path

    def _memory(self) -> dict[str, list[int]]:
        """Every rank's peak memory (GPU: allocated by torch; CPU: the process's peak resident set) and the
        parameter bytes it holds, in rank order; a collective when a process group is up."""
        mine = (peak_memory_bytes(str(self.ctx.device)), held_param_bytes(self.model))
        every = self.coll.all_gather_object(mine)
        return {"peak_memory_bytes_per_worker": [int(p) for p, _ in every],
                "param_bytes_per_worker": [int(b) for _, b in every]}

    # ---- the loop ----------------------------------------------------------------------------------

    def _finished(self) -> bool:
        stop_at = self.cfg.train.stop_at_step
        return self._stopped or self.progress.step >= self.total_steps or bool(stop_at and self.progress.step >= stop_at)

    def _announce(self) -> None:
        if self.ctx.rank != 0:
            return
        p, W = self.progress, self.ctx.world_size
        where = f"resuming at step {p.step}" if self.resumed_from is not None else "starting"
        backend = dist.get_backend() if dist.is_initialized() else "none"
        global_batch = self._global_batch()
        extra = self.strategy.describe()
        print(f"[raydist] {self.strategy.name}: {where}; {self.total_steps} steps, {self.shard.steps_per_epoch}/epoch, "
              f"{W} workers, global batch {global_batch}, backend {backend}{'; ' + extra if extra else ''}", flush=True)

    # ---- faults ------------------------------------------------------------------------------------------

    def _maybe_inject(self, step: int) -> None:
        """faults.inject_desync_*: one rank nudges one parameter, once per run (not again after a restart)."""
        f = self.cfg.faults
        if f.inject_desync_rank == self.ctx.rank and step == f.inject_desync_step and self.resumed_from is None:
            with torch.no_grad():
                local_tensor(next(self.model.parameters())).view(-1)[0] += 1.0
            print(f"[raydist] faults.inject_desync_rank: rank {self.ctx.rank} perturbed a parameter after step {step}",
                  flush=True)

    def _check_desync(self, rows: list[list[float]], agree: bool) -> None:
        """Act on the fingerprints every rank sees alike, so every rank takes the same decision."""
        f, step = self.cfg.faults, self.progress.step
        findings = desync.compare([r[0] for r in rows], [r[1] for r in rows] if agree else None,
                                  f.desync_tolerance, f.grad_norm_tolerance)
        for finding in findings:
            if self.ctx.rank == 0:
                print(f"[raydist] desync at step {step}: {finding.what}", flush=True)
        acted = [x for x in findings if x.act]
        if not acted or f.on_desync == "warn":
            return
        why = f"desync at step {step}: {acted[0].what}"
        if f.on_desync == "restart":
            raise desync.DesyncError(f"{why} (faults.on_desync=restart: restarting from the last checkpoint)")
        last = self.schedule.last_checkpoint
        self.aborted = f"{why} (faults.on_desync=stop: no checkpoint written after step {last})"

    def fit(self) -> dict[str, Any]:
        """Train to the end (or a stop); returns the last metrics reported."""
        ctx, W = self.ctx, self.ctx.world_size
        self._announce()
        # Where this session starts and what a step is worth: the driver's progress bar follows this file.
        self.log.write({"session_at_step": self.progress.step, "total_steps": self.total_steps, "world_size": W,
                        "samples_per_step": self._global_batch(), "strategy": self.strategy.name,
                        "from_peer": self.from_peer})
        window = torch.zeros(2, device=ctx.device)  # loss sum and steps since the last report
        ready, first_step = time.time(), True
        last: dict[str, Any] = {}
        for micro_batches in self.shard.steps(self.progress, self.cfg.train.grad_accum, self._finished):
            step = self._train_step(micro_batches)
            if step is None:
                continue
            window += torch.stack([step.loss_sum.float(), torch.ones((), device=ctx.device)])
            if first_step:  # where a session's start-up went (wall clock: the driver subtracts its own start)
                self.log.write({"startup": {"worker_entered": self.entered, "ready": ready, "first_step": time.time(),
                                            "from_peer": self.from_peer}})
                first_step = False
            self.export.count("samples_per_s", self._global_batch() / W)
            self.export.communication(self.comm.bytes, self.comm.wait_s)
            if not self.strategy.is_sync_point(self.progress.step, final=step.at_end or step.stop_at):
                self.log.write(step.record)
                self._export(step.record)
                continue
            try:
                metrics = self._sync_point(step, window)
            except (self.strategy.peer_lost if isinstance(self.strategy, FaultTolerant) else ()) as lost:  # nothing was reported; training goes on without the peer
                print(f"[raydist] {self.strategy.name}: step {self.progress.step}'s report dropped: {lost}", flush=True)
                continue
            if self.aborted:
                break
            last = metrics or last
        # A run resumed at its very end takes no step and reports nothing: its last checkpoint already holds the
        # final metrics, which Ray Train returns as the result.
        self.strategy.close()
        self.log.close()
        self.export.maybe_export(force=True)
        if self.ctx.rank == 0 and last and self.ctx.fit_id:
            write_final_result(self.cfg.run.run_dir, self.ctx.fit_id, last, self.checkpointed_at)
        return last

    def _global_batch(self) -> int:
        return self.cfg.train.batch_size * self.cfg.train.grad_accum * self.ctx.world_size

    def _epochs_done(self) -> int:
        """Epochs of this rank's data completed: the last step of an epoch counts it before the data rolls over."""
        p = self.progress
        return p.epoch + int(p.micro_in_epoch >= self.micro_per_epoch)

    def _train_step(self, micro_batches: list) -> _Step | None:
        """Forward, backward, the strategy's hooks and the optimizer: one step on this rank; None when the strategy
        did not commit it (its gradients are dropped, and the step is taken again on the next batch)."""
        cfg, p, strategy = self.cfg, self.progress, self.strategy
        t0 = time.perf_counter()
        if isinstance(strategy, DesyncCheck):
            strategy.measure_local_grad_norm(self.schedule.desync_due(p.step + 1))
        loss_sum = compute_gradients(self.forward_model, micro_batches, cfg, self.ctx.device, strategy.micro_step)
        strategy.after_backward(p.step)
        grad_norm = strategy.clip_grad_norm(cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf)
        if isinstance(strategy, FaultTolerant) and not strategy.commit():
            strategy.zero_grad(self.optimizer)
            return None
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self._maybe_inject(p.step + 1)
        self.scheduler.step()
        strategy.zero_grad(self.optimizer)
        self.straggler.after_step(p.step + 1, time.perf_counter() - t0)
        p.step += 1
        p.micro_in_epoch += cfg.train.grad_accum
        self.speed.add(self._global_batch())
        strategy.after_step(p.step)
        record = {
            "step": p.step,
            "epoch": p.epoch,
            "loss": loss_sum.item(),  # this rank's; replaced by the global loss where there is one
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "step_time_s": time.perf_counter() - t0,
            "time_s": time.perf_counter() - self.speed.session_start,
        }
        stop_at = bool(cfg.train.stop_at_step and p.step >= cfg.train.stop_at_step)
        return _Step(record, loss_sum, grad_norm, at_end=p.step >= self.total_steps, stop_at=stop_at)

    def _sync_point(self, step: _Step, window: torch.Tensor) -> dict[str, Any] | None:
        """Every rank is here, at this step: agree on what is due (one all-reduce), check for desync, decide on a
        stop, then report (evaluate, checkpoint) if due. Returns the metrics reported, None if nothing was."""
        p, W = self.progress, self.ctx.world_size
        due = self.schedule.due(p.step, time.perf_counter(), epochs=self._epochs_done(), final=step.at_end)
        votes = self._vote(step, window, due)
        if self.strategy.global_step_loss():
            step.record["loss"] = votes[_STEP_LOSS].item() / W
        self.log.write(step.record)
        self._export(step.record)
        if due.desync_check:
            self.schedule.checked_desync(p.step)
            self._check_desync(votes[_FINGERPRINTS:].view(W, desync.SLOTS).tolist(),
                               self.strategy.replicas_agree(step.at_end) if isinstance(self.strategy, DesyncCheck)
                               else W == 1)
            if self.aborted:
                return None
        stopping = self._agree_on_stop(votes, step)
        due = replace(due, report=votes[_REPORT_VOTE].item() > 0)  # rank 0's clock decides for every rank
        if stopping:
            due = due.ending()
        if not due.reports:
            return None
        return self._report(step, window, votes, due)

    def _vote(self, step: _Step, window: torch.Tensor, due: Due) -> torch.Tensor:
        """The strategy's exchange, then the sync point's one all-reduce: the loss window, rank 0's report and stop
        votes and, when a desync check is due, every rank's fingerprint."""
        ctx, W = self.ctx, self.ctx.world_size
        votes = torch.zeros(_FINGERPRINTS + desync.SLOTS * W, device=ctx.device, dtype=torch.float64)
        votes[_LOSS_SUM], votes[_LOSS_STEPS] = window[0], window[1]
        votes[_STEP_LOSS] = step.loss_sum.float()
        votes[_REPORT_VOTE] = float(ctx.rank == 0 and due.report)
        if ctx.rank == 0 and due.stop_poll:
            votes[_POLL_VOTE] = 1.0
            self.stop_reason = next(filter(None, (request() for request in self.stop_requests)), None)
            votes[_STOP_VOTE] = float(self.stop_reason is not None)
        with self.comm.waiting():  # where the others wait for a straggler
            self.strategy.synchronize(final=step.at_end)
        if due.desync_check:  # this rank's fingerprint rides on the same all-reduce
            local = self.strategy.local_grad_norm() if isinstance(self.strategy, DesyncCheck) else None
            row = _FINGERPRINTS + desync.SLOTS * ctx.rank
            votes[row] = (local if local is not None else step.grad_norm).double()
            votes[row + 1] = desync.param_checksum(self.model)
        with self.comm.waiting():
            self.coll.all_reduce(votes)
        return votes

    def _agree_on_stop(self, votes: torch.Tensor, step: _Step) -> bool:
        """Whether the run stops at this step (not its last), alike on every rank; sets stop_reason."""
        polled, stop = votes[_POLL_VOTE].item() > 0, votes[_STOP_VOTE].item() > 0
        if polled:
            self.schedule.polled(time.perf_counter())
        if polled and not stop:
            self.stop_reason = self.ctx.preemption()  # Ray's own path; every rank asks at the same sync point
        elif stop:
            self.stop_reason = self.stop_reason or "stop requested"  # rank 0 knows why
        if step.stop_at and not self.stop_reason:
            self.stop_reason = f"train.stop_at_step={self.cfg.train.stop_at_step}"
        self._stopped = not step.at_end and self.stop_reason is not None
        return self._stopped

    def _report(self, step: _Step, window: torch.Tensor, votes: torch.Tensor, due: Due) -> dict[str, Any]:
        """Report this step's metrics to Ray Train (with a checkpoint when one is due), evaluating first if due."""
        ctx, p, W = self.ctx, self.progress, self.ctx.world_size
        self.schedule.reported(time.perf_counter())
        metrics = {**step.record, "loss": (votes[_LOSS_SUM] / votes[_LOSS_STEPS]).item(),
                   "samples_per_s": self.speed.window_rate(), "strategy": self.strategy.name}
        window.zero_()
        if due.evaluate:
            model = self.strategy.eval_model(final=step.at_end)
            scores = evaluate(model, self.data, self.cfg, ctx, self.coll.all_reduce)
            metrics.update(scores)
            self.log.write({"eval_at_step": p.step, "time_s": step.record["time_s"], **scores})
            self.export.observe(test_accuracy=scores.get("test_accuracy"))
            self.schedule.evaluated(self._epochs_done())
        if due.final:
            metrics.update(comm=per_worker_summary(self.coll.all_gather_object(self.comm.as_dict())),
                           memory=self._memory(), total_steps=self.total_steps, world_size=W,
                           **(self.strategy.final_metrics(self.coll) if isinstance(self.strategy, FinalMetrics) else {}))
            if not step.at_end:  # a stop
                metrics["stop_reason"] = self.stop_reason
                if ctx.rank == 0:
                    print(f"[raydist] {self.strategy.name}: stopping at step {p.step}: {self.stop_reason}", flush=True)
        if self.resumed_from is not None:
            metrics["resumed_from_step"] = self.resumed_from
        metrics.update(self.speed.session())
        if ctx.rank == 0 and self.cfg.run.verbose:  # else the driver's progress bar shows them
            print(progress_line(metrics), flush=True)
        if due.checkpoint:
            self._checkpoint(metrics)
        else:
            ctx.report(metrics, None, p.step)
        return metrics

    def _export(self, record: dict[str, Any]) -> None:
        self.export.observe(step=record["step"], total_steps=self.total_steps, loss=record["loss"],
                            grad_norm=record["grad_norm"], lr=record["lr"], step_time_s=record["step_time_s"])
        self.export.maybe_export()
