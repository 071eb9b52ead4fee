"""The Downpour worker actor: computes gradients on its own data shard, pushes them without waiting, fetches every n_fetch steps."""

from __future__ import annotations

import math
import time
from typing import Any

import ray
import torch

from raydist.checkpoint import Progress
from raydist.commstats import CommStats
from raydist.config import Config
from raydist.data import load_splits
from raydist.flat import as_tensor, flatten_
from raydist.models import build_model
from raydist.strategies.async_ps.messages import PullReply, WorkerReport
from raydist.observability.ray_metrics import Exporter
from raydist.seeding import reseed
from raydist.sharding import worker_shard
from raydist.straggler import Straggler
from raydist.train.step import compute_gradients


class DownpourWorker:
    def __init__(self, config: dict[str, Any], rank: int, world_size: int, shards: list, bounds: list[tuple[int, int]],
                 gate=None):
        self.cfg = cfg = Config.from_dict(config)
        torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
        self.rank, self.world_size = rank, world_size
        self.shards, self.bounds, self.gate = shards, bounds, gate
        self.device = torch.device("cuda" if cfg.scaling.use_gpu else "cpu")
        self.data = load_splits(cfg.data)
        self.model = build_model(cfg.model, self.data).to(self.device)
        self.params, self.grads = flatten_(self.model, self.device)
        self.nbytes = self.params.numel() * self.params.element_size()

    def _fetch(self, want: int) -> tuple[list[int], PullReply]:
        """Every shard's slice into our parameters; shard 0 tops our grant up by `want`. Returns the versions
        and shard 0's reply (grant and lr)."""
        replies: list[PullReply] = ray.get([s.pull.remote(want if i == 0 else 0) for i, s in enumerate(self.shards)])
        for (a, b), reply in zip(self.bounds, replies):
            self.params[a:b].copy_(as_tensor(reply.params))
        return [r.version for r in replies], replies[0]

    def run(self, start_step: int, start_time: float) -> WorkerReport:
        """Train until shard 0 grants no more steps; `start_step` is this worker's position in its data (resume)."""
        cfg, rank = self.cfg, self.rank
        n_fetch = cfg.async_ps.n_fetch
        shard = worker_shard(self.data.train, cfg, rank, self.world_size, loader_seed=cfg.train.seed + rank)
        epoch, offset = divmod(start_step, shard.steps_per_epoch)
        progress = Progress(step=start_step, epoch=epoch, micro_in_epoch=offset)
        batches = shard.steps(progress, 1, finished=lambda: False)  # this worker's batches, epoch after epoch
        reseed(cfg.train.seed, rank, start_step)  # dropout differs per worker and per resume

        comm, straggler = CommStats(), Straggler(cfg.straggler, rank)
        export = Exporter(cfg.run.name, "async", "worker", rank, device=str(self.device))
        clip = cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf
        versions = [0] * len(self.shards)
        pending: list[ray.ObjectRef] = []  # pushes not yet acknowledged: we never wait on them while training
        grant = since_fetch = dropped = 0
        fetch_due = True
        ticket_base: int | None = None  # `wait` bound: how new our parameters are, in the gate's terms
        lr = cfg.optim.lr
        began = time.perf_counter()
        while True:
            if self.gate is not None:
                with comm.waiting():
                    if pending:  # our last gradient must be applied everywhere before its ticket goes back
                        dropped += ray.get(pending).count(False)
                        pending = []
                        self.gate.release.remote(rank)  # same caller, same actor: runs before our acquire
                    ticket_base = ray.get(self.gate.acquire.remote(rank, None if fetch_due else ticket_base))
                    if ticket_base is None:  # our parameters are too old for the bound: fetch, then ask again
                        ticket_base = ray.get(self.gate.acquire.remote(rank, None))
                        fetch_due = True
            if fetch_due:
                with comm.waiting():
                    # Shard 0 tops our grant up to n_fetch steps; a reply comes after our earlier pushes to that
                    # shard (one caller's calls to an actor run in order), so it also acknowledges them.
                    versions, head = self._fetch(n_fetch - grant)
                    dropped += ray.get(pending).count(False)
                pending = []
                grant += head.granted
                lr = head.lr
                comm.add(self.nbytes)
                since_fetch, fetch_due = 0, False
                if grant == 0:  # the budget is spent
                    if self.gate is not None:
                        self.gate.release.remote(rank)
                    break

            t0 = time.perf_counter()
            self.grads.zero_()
            loss = compute_gradients(self.model, next(batches), cfg, self.device)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            progress.step += 1
            progress.micro_in_epoch += 1
            step_time = time.perf_counter() - t0
            straggler.after_step(progress.step, step_time)  # a slow worker's gradient arrives late, as it would

            grads = self.grads.cpu()  # a no-op on CPU
            meta = {"worker": rank, "epoch": progress.epoch, "loss": loss.item(), "grad_norm": grad_norm.item(),
                    "step_time_s": step_time, "time_s": time.time() - start_time}
            # Each slice is a view of the flat gradient; Ray copies it into the object store as it submits.
            pending += [s.push.remote(grads[a:b].numpy(), versions[i], rank, meta if i == 0 else None)
                        for i, (s, (a, b)) in enumerate(zip(self.shards, self.bounds))]
            comm.add(self.nbytes)
            export.count("samples_per_s", cfg.train.batch_size)
            export.communication(comm.bytes, comm.wait_s)
            export.observe(step=progress.step, loss=meta["loss"], grad_norm=meta["grad_norm"], lr=lr,
                           step_time_s=step_time)
            export.maybe_export()
            grant -= 1
            since_fetch += 1
            fetch_due = grant == 0 or since_fetch >= n_fetch
            if not fetch_due:  # Downpour: keep descending locally until the next fetch
                self.params.add_(self.grads, alpha=-lr)
        export.maybe_export(force=True)
        steps = progress.step - start_step
        return WorkerReport(rank=rank, steps=steps, samples=steps * cfg.train.batch_size, dropped=dropped,
                            train_time_s=time.perf_counter() - began, bytes=comm.bytes, wait_s=comm.wait_s)
