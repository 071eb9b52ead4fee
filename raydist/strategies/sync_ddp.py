"""Synchronous data-parallel training with DDP: the loop every worker runs, resumable at any step."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from raydist.checkpoint import Progress, load_state, rng_state, save_state, set_rng_state
from raydist.commstats import CommStats, allreduce_bytes, tensor_bytes
from raydist.config import Config
from raydist.context import RayTrainContext, WorkerContext, new_checkpoint_dir
from raydist.data import load_splits
from raydist.evaluation import autocast, evaluate
from raydist.metrics import MetricsLog, Throughput, progress_line
from raydist.models import build_model
from raydist.optim import build_optimizer, build_scheduler
from raydist.sharding import total_steps as run_length, worker_shard
from raydist.straggler import Straggler

STRATEGY = "sync"

def run(cfg: Config, ctx: WorkerContext) -> dict[str, Any]:
    """Train until the configured step count (or stop_at_step); returns the last metrics reported."""
    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
    data = load_splits(cfg.data)
    model = build_model(cfg.model, data).to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device] if ctx.device.type == "cuda" else None)
    optimizer = build_optimizer(model.parameters(), cfg.optim)

    bs, accum = cfg.train.batch_size, cfg.train.grad_accum
    shard = worker_shard(data.train, cfg, ctx.rank, ctx.world_size, loader_seed=cfg.train.seed)
    steps_per_epoch = shard.steps_per_epoch
    total_steps = run_length(cfg, steps_per_epoch)
    scheduler = build_scheduler(optimizer, total_steps, cfg.schedule)

    progress = Progress()
    resumed_from = None
    with ctx.latest_checkpoint() as ckpt_dir:
        if ckpt_dir is not None:
            state = load_state(ckpt_dir)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scheduler.load_state_dict(state["scheduler"])
            progress = state["progress"]
            rngs = state["rng_per_rank"]
            if len(rngs) == ctx.world_size:
                set_rng_state(rngs[ctx.rank])
            else:  # a different worker count: the sample order changes anyway, so only reseed
                torch.manual_seed(cfg.train.seed + progress.step * 1000 + ctx.rank)
            resumed_from = progress.step

    log = MetricsLog(cfg.run.run_dir, enabled=ctx.rank == 0)
    speed = Throughput()
    comm = CommStats()
    step_bytes = allreduce_bytes(tensor_bytes(model), ctx.world_size)  # DDP all-reduces every gradient once a step
    straggler = Straggler(cfg.straggler, ctx.rank)
    last: dict[str, Any] = {}
    last_ckpt_step = progress.step if resumed_from is not None else -1
    global_batch = bs * accum * ctx.world_size
    clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf
    if ctx.rank == 0:
        where = f"resuming at step {progress.step}" if resumed_from is not None else "starting"
        print(f"[raydist] sync: {where}; {total_steps} steps, {steps_per_epoch}/epoch, {ctx.world_size} workers, "
              f"global batch {global_batch}, backend {dist.get_backend() if dist.is_initialized() else 'none'}",
              flush=True)

    def checkpoint(metrics: dict[str, Any]) -> None:
        nonlocal last_ckpt_step
        rngs: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(rngs, rng_state())
        directory = None
        if ctx.rank == 0:
            directory = new_checkpoint_dir()
            save_state(directory, model=model, optimizer=optimizer, scheduler=scheduler, progress=progress,
                       rng_per_rank=rngs, extra={"config": cfg.to_dict(), "world_size": ctx.world_size})
        ctx.report(metrics, directory, progress.step)
        last_ckpt_step = progress.step

    stop_at = cfg.train.stop_at_step
    last_report = time.perf_counter()
    micro_per_epoch = steps_per_epoch * accum

    def finished() -> bool:
        return progress.step >= total_steps or bool(stop_at and progress.step >= stop_at)

    for micro_batches in shard.steps(progress, accum, finished):
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=ctx.device)
        for micro, (x, y) in enumerate(micro_batches):
            x, y = x.to(ctx.device, non_blocking=True), y.to(ctx.device, non_blocking=True)
            # Only the last micro-step all-reduces: the others accumulate gradients locally.
            sync = contextlib.nullcontext() if micro == accum - 1 else ddp.no_sync()
            with sync:
                with autocast(cfg, ctx.device):
                    loss = F.cross_entropy(ddp(x).float(), y) / accum
                loss.backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        straggler.after_step(progress.step + 1, time.perf_counter() - t0)
        # One all-reduce carries the global loss and rank 0's "time to report" vote, so all ranks agree
        # on when to call ray.train.report (a barrier) without a clock of their own.
        due = ctx.rank == 0 and time.perf_counter() - last_report >= cfg.train.report_every_s
        shared = torch.stack([loss_sum.float(), torch.tensor(float(due), device=ctx.device)])
        with comm.waiting():  # where the others wait for a straggler
            dist.all_reduce(shared)
        comm.add(step_bytes)
        progress.step += 1
        progress.micro_in_epoch += accum
        speed.add(global_batch)
        record = {
            "step": progress.step,
            "epoch": progress.epoch,
            "loss": shared[0].item() / ctx.world_size,
            "grad_norm": grad_norm.item(),
            "lr": lr,
            "step_time_s": time.perf_counter() - t0,
            "time_s": time.perf_counter() - speed.session_start,
        }
        log.write(record)

        at_end = finished()
        epoch_end = progress.micro_in_epoch >= micro_per_epoch
        ckpt_due = bool(cfg.checkpoint.every_steps) and progress.step % cfg.checkpoint.every_steps == 0
        if not (shared[1].item() > 0 or ckpt_due or at_end or epoch_end):
            continue
        last_report = time.perf_counter()
        metrics = {**record, "samples_per_s": speed.window_rate(), "strategy": STRATEGY}
        if epoch_end or at_end:
            scores = evaluate(ddp, data, cfg, ctx)
            metrics.update(scores)
            log.write({"eval_at_step": progress.step, "time_s": record["time_s"], **scores})
        if at_end:
            metrics["summary_extra"] = comm.gather(ctx.world_size)
        if resumed_from is not None:
            metrics["resumed_from_step"] = resumed_from
        metrics.update(speed.session())
        if ctx.rank == 0:
            print(progress_line(metrics), flush=True)
        if ckpt_due or at_end or (epoch_end and not cfg.checkpoint.every_steps):
            checkpoint(metrics)
        else:
            ctx.report(metrics, None, progress.step)
        last = metrics

    if last_ckpt_step != progress.step:  # e.g. resumed at the very end: still leave a final checkpoint
        last = {"step": progress.step, "epoch": progress.epoch, "strategy": STRATEGY, **evaluate(ddp, data, cfg, ctx),
                **speed.session(), "summary_extra": comm.gather(ctx.world_size)}
        checkpoint(last)
    log.close()
    return last


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker."""
    cfg = Config.from_dict(config)
    run(cfg, RayTrainContext(async_upload=cfg.checkpoint.async_upload))
