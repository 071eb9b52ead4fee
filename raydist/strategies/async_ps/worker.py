"""The Downpour worker actor: computes gradients on its own data shard, pushes them without waiting, fetches every n_fetch steps."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
import torch

from raydist.config import Config
from raydist.observability.ray_metrics import Exporter
from raydist.strategies.async_ps.messages import PullReply, WorkerReport
from raydist.torchkit.checkpoint import Progress
from raydist.torchkit.commstats import CommStats
from raydist.torchkit.data import load_splits
from raydist.torchkit.flat import as_tensor, flatten_
from raydist.torchkit.models import build_model
from raydist.torchkit.seeding import reseed
from raydist.torchkit.sharding import worker_shard
from raydist.torchkit.straggler import Straggler
from raydist.train.step import compute_gradients


@dataclass
class _Run:
    """One `run` call's state: where the worker is in its data, the steps it may still take, what is in flight."""

    progress: Progress
    batches: Iterator
    comm: CommStats
    straggler: Straggler
    export: Exporter
    lr: float
    versions: list[int]
    """Each shard's version of the parameters our gradients are computed on."""
    pending: list = field(default_factory=list)
    """Pushes not yet acknowledged: we never wait on them while training."""
    grant: int = 0
    since_fetch: int = 0
    dropped: int = 0
    fetch_due: bool = True
    ticket_base: int | None = None
    """`wait` bound: how new our parameters are, in the gate's terms."""


class DownpourWorker:
    def __init__(
        self, config: dict[str, Any], rank: int, world_size: int, shards: list, bounds: list[tuple[int, int]], gate=None
    ):
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
        r = self._start(start_step)
        began = time.perf_counter()
        while True:
            if self.gate is not None:
                self._admit(r)
            if r.fetch_due and not self._refresh(r):
                break  # the budget is spent
            self._step(r, start_time)
        r.export.maybe_export(force=True)
        steps = r.progress.step - start_step
        return WorkerReport(
            rank=self.rank,
            steps=steps,
            samples=steps * self.cfg.train.batch_size,
            dropped=r.dropped,
            train_time_s=time.perf_counter() - began,
            bytes=r.comm.bytes,
            wait_s=r.comm.wait_s,
        )

    def _start(self, start_step: int) -> _Run:
        """This worker's batches, epoch after epoch, from `start_step` on."""
        cfg, rank = self.cfg, self.rank
        shard = worker_shard(self.data.train, cfg, rank, self.world_size, loader_seed=cfg.train.seed + rank)
        epoch, offset = divmod(start_step, shard.steps_per_epoch)
        progress = Progress(step=start_step, epoch=epoch, micro_in_epoch=offset)
        batches = shard.steps(progress, 1, finished=lambda: False)
        reseed(cfg.train.seed, rank, start_step)  # dropout differs per worker and per resume
        return _Run(
            progress,
            batches,
            CommStats(),
            Straggler(cfg.straggler, rank),
            Exporter(cfg.run.name, "async", "worker", rank, device=str(self.device)),
            lr=cfg.optim.lr,
            versions=[0] * len(self.shards),
        )

    def _admit(self, r: _Run) -> None:
        """The staleness gate's ticket for the next step (async_ps.on_stale=wait)."""
        with r.comm.waiting():
            if r.pending:  # our last gradient must be applied everywhere before its ticket goes back
                r.dropped += ray.get(r.pending).count(False)
                r.pending = []
                self.gate.release.remote(self.rank)  # same caller, same actor: runs before our acquire
            r.ticket_base = ray.get(self.gate.acquire.remote(self.rank, None if r.fetch_due else r.ticket_base))
            if r.ticket_base is None:  # our parameters are too old for the bound: fetch, then ask again
                r.ticket_base = ray.get(self.gate.acquire.remote(self.rank, None))
                r.fetch_due = True

    def _refresh(self, r: _Run) -> bool:
        """Fetch the parameters and top the grant up; False when no step is granted: the budget is spent."""
        with r.comm.waiting():
            # Shard 0 tops our grant up to n_fetch steps; a reply comes after our earlier pushes to that
            # shard (one caller's calls to an actor run in order), so it also acknowledges them.
            r.versions, head = self._fetch(self.cfg.async_ps.n_fetch - r.grant)
            r.dropped += ray.get(r.pending).count(False)
        r.pending = []
        r.grant += head.granted
        r.lr = head.lr
        r.comm.add(self.nbytes)
        r.since_fetch, r.fetch_due = 0, False
        if r.grant == 0 and self.gate is not None:
            self.gate.release.remote(self.rank)
        return r.grant > 0

    def _step(self, r: _Run, start_time: float) -> None:
        """One gradient, pushed to every shard without waiting; Downpour's local descent until the next fetch."""
        cfg, p = self.cfg, r.progress
        t0 = time.perf_counter()
        self.grads.zero_()
        loss = compute_gradients(self.model, next(r.batches), cfg, self.device)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), cfg.train.grad_clip if cfg.train.grad_clip > 0 else math.inf
        )
        p.step += 1
        p.micro_in_epoch += 1
        step_time = time.perf_counter() - t0
        r.straggler.after_step(p.step, step_time)  # a slow worker's gradient arrives late, as it would
        meta = {
            "worker": self.rank,
            "epoch": p.epoch,
            "loss": loss.item(),
            "grad_norm": grad_norm.item(),
            "step_time_s": step_time,
            "time_s": time.time() - start_time,
        }
        self._push(r, meta)
        r.export.observe(step=p.step, loss=meta["loss"], grad_norm=meta["grad_norm"], lr=r.lr, step_time_s=step_time)
        r.export.maybe_export()
        r.grant -= 1
        r.since_fetch += 1
        r.fetch_due = r.grant == 0 or r.since_fetch >= cfg.async_ps.n_fetch
        if not r.fetch_due:  # Downpour: keep descending locally until the next fetch
            self.params.add_(self.grads, alpha=-r.lr)

    def _push(self, r: _Run, meta: dict[str, Any]) -> None:
        grads = self.grads.cpu()  # a no-op on CPU
        # Each slice is a view of the flat gradient; Ray copies it into the object store as it submits.
        r.pending += [
            s.push.remote(grads[a:b].numpy(), r.versions[i], self.rank, meta if i == 0 else None)
            for i, (s, (a, b)) in enumerate(zip(self.shards, self.bounds))
        ]
        r.comm.add(self.nbytes)
        r.export.count("samples_per_s", self.cfg.train.batch_size)
        r.export.communication(r.comm.bytes, r.comm.wait_s)
