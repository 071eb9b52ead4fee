"""Synchronous data parallel: PyTorch DDP all-reduces every gradient, every step is a sync point."""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from raydist.commstats import allreduce_bytes, tensor_bytes
from raydist.train.strategy import Strategy


def _allreduce_measuring(strategy: "SyncDDP", bucket):  # no annotations: DDP checks them as objects
    """DDP's own all-reduce (mean), after adding the bucket's squared norm when a desync check wants this
    rank's gradient norm from before the exchange."""
    if strategy.local_sq is not None:
        strategy.local_sq += bucket.buffer().detach().double().pow(2).sum()
    return default_hooks.allreduce_hook(None, bucket)


class SyncDDP(Strategy):
    name = "sync"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        self.model = model
        self.ddp = DistributedDataParallel(model, device_ids=[self.ctx.device] if self.ctx.device.type == "cuda" else None)
        self.step_bytes = allreduce_bytes(tensor_bytes(model), self.world_size)  # every gradient, once a step
        self.local_sq: torch.Tensor | None = None
        if self.cfg.faults.desync_every_steps:
            self.ddp.register_comm_hook(self, _allreduce_measuring)
        return self.ddp

    def measure_local_grad_norm(self, on: bool) -> None:
        self.local_sq = torch.zeros((), dtype=torch.float64, device=self.ctx.device) if on else None

    def local_grad_norm(self) -> torch.Tensor | None:
        return None if self.local_sq is None else self.local_sq.sqrt()

    def replicas_agree(self, final: bool) -> bool:
        return True  # DDP's replicas start from rank 0's weights and apply the same averaged gradient

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        # Only the step's last micro-batch all-reduces: the others accumulate gradients locally.
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def synchronize(self, final: bool) -> None:
        self.comm.add(self.step_bytes)  # DDP's all-reduce already ran inside backward

    def eval_model(self, final: bool) -> torch.nn.Module:
        return self.ddp
