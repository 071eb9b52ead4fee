"""Local SGD on Ray Train: workers step on their own and average parameters every H steps (all-reduce or ring Polyak).

Workers meet only at sync points (every `local_sgd.sync_every` steps, every step of the synchronous warm-up,
and at the end), so everything collective (averaging, the loss/report vote, evaluation, checkpoints, Ray
Train reports) happens there, and every rank reaches each sync point at the same step.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from raydist.checkpoint import Progress, load_state, rng_state, save_state, set_rng_state
from raydist.commstats import CommStats, allreduce_bytes
from raydist.config import Config
from raydist.context import RayTrainContext, WorkerContext, new_checkpoint_dir
from raydist.data import load_splits
from raydist.evaluation import autocast, evaluate
from raydist.flat import flatten_
from raydist.metrics import MetricsLog, Throughput, progress_line
from raydist.models import build_model
from raydist.optim import build_optimizer, build_scheduler
from raydist.sharding import total_steps as run_length, worker_shard
from raydist.straggler import Straggler

STRATEGY = "local_sgd"


def average_allreduce(flat: torch.Tensor, world_size: int) -> None:
    """Every worker ends with the mean of all workers' vectors."""
    if world_size > 1:
        dist.all_reduce(flat)
        flat.div_(world_size)


def ring_polyak(flat: torch.Tensor, alpha: float, rank: int, world_size: int) -> None:
    """Each worker mixes in its left neighbour's vector: p <- (1 - alpha) p + alpha p_left.

    Send to the right and receive from the left are posted together as non-blocking operations, so no
    worker waits on a send before its receive is up: no ordering deadlock for any world size (for 2 the
    neighbours coincide; for 1 there is nothing to exchange).
    """
    if world_size == 1:
        return
    received = torch.empty_like(flat)
    ops = [dist.P2POp(dist.isend, flat, (rank + 1) % world_size), dist.P2POp(dist.irecv, received, (rank - 1) % world_size)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    flat.mul_(1.0 - alpha).add_(received, alpha=alpha)


def run(cfg: Config, ctx: WorkerContext) -> dict[str, Any]:
    """Train until the configured step count (or stop_at_step); returns the last metrics reported."""
    lcfg, W = cfg.local_sgd, ctx.world_size
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    data = load_splits(cfg.data)
    model = build_model(cfg.model, data).to(ctx.device)
    params, grads = flatten_(model, ctx.device)  # one buffer each: averaging is one collective
    nbytes = params.numel() * params.element_size()
    optimizer = build_optimizer(model.parameters(), cfg.optim)

    bs, accum = cfg.train.batch_size, cfg.train.grad_accum
    shard = worker_shard(data.train, cfg, ctx.rank, W, loader_seed=cfg.train.seed)
    steps_per_epoch = shard.steps_per_epoch
    total_steps = run_length(cfg, steps_per_epoch)
    scheduler = build_scheduler(optimizer, total_steps, cfg.schedule)

    progress = Progress()
    resumed_from = None
    since_sync = 0  # local steps since the last averaging
    with ctx.latest_checkpoint() as ckpt_dir:
        if ckpt_dir is not None:
            state = load_state(ckpt_dir)
            extra = state["extra"]
            same_world = extra["world_size"] == W
            # Between averagings the workers' models and optimizers differ: each rank takes back its own.
            model.load_state_dict(extra["model_per_rank"][ctx.rank if same_world else 0])
            optimizer.load_state_dict(extra["optimizer_per_rank"][ctx.rank if same_world else 0])
            scheduler.load_state_dict(state["scheduler"])
            progress = state["progress"]
            since_sync = extra["since_sync"] if same_world else 0
            if same_world:
                set_rng_state(state["rng_per_rank"][ctx.rank])
            else:
                torch.manual_seed(cfg.train.seed + progress.step * 1000 + ctx.rank)
            resumed_from = progress.step

    log = MetricsLog(cfg.run.run_dir, enabled=ctx.rank == 0)
    speed = Throughput()
    comm = CommStats()
    straggler = Straggler(cfg.straggler, ctx.rank)
    last: dict[str, Any] = {}
    last_ckpt_step = progress.step
    global_batch = bs * accum * W
    clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf
    if ctx.rank == 0:
        where = f"resuming at step {progress.step}" if resumed_from is not None else "starting"
        print(f"[raydist] local_sgd: {where}; {total_steps} steps, {steps_per_epoch}/epoch, {W} workers, "
              f"averaging {lcfg.averaging} every {lcfg.sync_every} steps after {lcfg.warmup_sync_steps} synchronous",
              flush=True)

    def averaged_model() -> torch.nn.Module:
        """The model evaluation scores: the workers' mean (the same as each worker's right after an all-reduce)."""
        identical = W == 1 or since_sync == 0 and (
            lcfg.averaging == "allreduce" or at_end or progress.step <= lcfg.warmup_sync_steps)
        if identical:
            return model
        mean = copy.deepcopy(model)  # not build_model: that would draw from the RNG a resumed run restores
        flat, _ = flatten_(mean, ctx.device)
        average_allreduce(flat, W)
        return mean

    def checkpoint(metrics: dict[str, Any]) -> None:
        nonlocal last_ckpt_step
        per_rank: list[Any] = [None] * W
        dist.all_gather_object(per_rank, (model.state_dict(), optimizer.state_dict(), rng_state()))
        directory = None
        if ctx.rank == 0:
            directory = new_checkpoint_dir()
            save_state(directory, model=model, optimizer=optimizer, scheduler=scheduler, progress=progress,
                       rng_per_rank=[r[2] for r in per_rank],
                       extra={"config": cfg.to_dict(), "world_size": W, "since_sync": since_sync,
                              "model_per_rank": [r[0] for r in per_rank], "optimizer_per_rank": [r[1] for r in per_rank]})
        ctx.report(metrics, directory, progress.step)
        last_ckpt_step = progress.step

    stop_at = cfg.train.stop_at_step
    micro_per_epoch = steps_per_epoch * accum
    last_report = time.perf_counter()
    loss_acc = torch.zeros(2, device=ctx.device)  # loss sum and step count since the last sync point
    eval_due = False
    at_end = False

    def finished() -> bool:
        return progress.step >= total_steps or bool(stop_at and progress.step >= stop_at)

    for micro_batches in shard.steps(progress, accum, finished):
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=ctx.device)
        for x, y in micro_batches:
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            with autocast(cfg, ctx.device):
                loss = F.cross_entropy(model(x).float(), y) / accum
            loss.backward()
            loss_sum += loss.detach()
        warm = progress.step < lcfg.warmup_sync_steps
        if warm and W > 1:  # post-local SGD's first phase: plain synchronous SGD, gradients averaged
            with comm.waiting():
                average_allreduce(grads, W)
            comm.add(allreduce_bytes(nbytes, W))
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        grads.zero_()  # not zero_grad(set_to_none): the gradients must stay views of the flat buffer
        straggler.after_step(progress.step + 1, time.perf_counter() - t0)
        progress.step += 1
        progress.micro_in_epoch += accum
        speed.add(global_batch)
        since_sync = 0 if warm else since_sync + 1
        loss_acc += torch.stack([loss_sum.float(), torch.ones((), device=ctx.device)])
        record = {
            "step": progress.step,
            "epoch": progress.epoch,
            "loss": loss_sum.item(),  # this worker's: between sync points there is no global loss
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "step_time_s": time.perf_counter() - t0,
            "time_s": time.perf_counter() - speed.session_start,
        }
        log.write(record)
        eval_due |= progress.micro_in_epoch >= micro_per_epoch
        at_end = progress.step >= total_steps
        stopping = bool(stop_at and progress.step >= stop_at)
        if not (warm or since_sync >= lcfg.sync_every or at_end or stopping):
            continue

        # A sync point: every rank is here at this step.
        due = ctx.rank == 0 and time.perf_counter() - last_report >= cfg.train.report_every_s
        with comm.waiting():
            if since_sync >= lcfg.sync_every or (at_end and since_sync > 0):
                if lcfg.averaging == "ring" and not at_end:
                    ring_polyak(params, lcfg.alpha, ctx.rank, W)
                    comm.add(2 * nbytes if W > 1 else 0)
                else:  # the end always takes the full mean: one final model
                    average_allreduce(params, W)
                    comm.add(allreduce_bytes(nbytes, W))
                since_sync = 0
            shared = torch.cat([loss_acc, torch.tensor([float(due)], device=ctx.device)])
            if W > 1:
                dist.all_reduce(shared)
        loss_acc.zero_()
        ckpt_due = (progress.step - last_ckpt_step >= cfg.checkpoint.every_steps if cfg.checkpoint.every_steps
                    else eval_due)
        if not (shared[2].item() > 0 or eval_due or ckpt_due or at_end or stopping):
            continue
        last_report = time.perf_counter()
        metrics = {**record, "loss": (shared[0] / shared[1]).item(), "samples_per_s": speed.window_rate(),
                   "strategy": STRATEGY}
        if eval_due or at_end or stopping:
            scores = evaluate(averaged_model(), data, cfg, ctx)
            metrics.update(scores)
            log.write({"eval_at_step": progress.step, "time_s": record["time_s"], **scores})
            eval_due = False
        if at_end or stopping:
            metrics["summary_extra"] = comm.gather(W)
        if resumed_from is not None:
            metrics["resumed_from_step"] = resumed_from
        metrics.update(speed.session())
        if ctx.rank == 0:
            print(progress_line(metrics), flush=True)
        if ckpt_due or at_end or stopping:
            checkpoint(metrics)
        else:
            ctx.report(metrics, None, progress.step)
        last = metrics

    if last_ckpt_step != progress.step or not last:  # resumed at the very end: still report and checkpoint
        at_end = True
        last = {"step": progress.step, "epoch": progress.epoch, "strategy": STRATEGY,
                **evaluate(averaged_model(), data, cfg, ctx), **speed.session(), "summary_extra": comm.gather(W)}
        checkpoint(last)
    log.close()
    return last


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker."""
    cfg = Config.from_dict(config)
    run(cfg, RayTrainContext(async_upload=cfg.checkpoint.async_upload))
