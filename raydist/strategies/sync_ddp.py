"""Synchronous data parallel: PyTorch DDP all-reduces every gradient, every step is a sync point."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from raydist.commstats import allreduce_bytes, tensor_bytes
from raydist.train.strategy import Strategy


class SyncDDP(Strategy):
    name = "sync"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        self.model = model
        self.ddp = DistributedDataParallel(model, device_ids=[self.ctx.device] if self.ctx.device.type == "cuda" else None)
        self.step_bytes = allreduce_bytes(tensor_bytes(model), self.world_size)  # every gradient, once a step
        return self.ddp

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        # Only the step's last micro-batch all-reduces: the others accumulate gradients locally.
        return contextlib.nullcontext() if last else self.ddp.no_sync()

    def synchronize(self, final: bool) -> None:
        self.comm.add(self.step_bytes)  # DDP's all-reduce already ran inside backward

    def eval_model(self, final: bool) -> torch.nn.Module:
        return self.ddp
