"""Synchronous data parallel: PyTorch DDP all-reduces every gradient, every step is a sync point."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from raydist.private_api import flatten_dense_tensors as _flatten_dense_tensors
from raydist.private_api import unflatten_dense_tensors as _unflatten_dense_tensors
from raydist.torchkit.commstats import allreduce_bytes, tensor_bytes
from raydist.train.strategy import DesyncCheck, Strategy


class SyncDDP(Strategy, DesyncCheck):
    name = "sync"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        self.model = model
        self.ddp = DistributedDataParallel(
            model, device_ids=[self.ctx.device] if self.ctx.device.type == "cuda" else None
        )
        self.step_bytes = allreduce_bytes(tensor_bytes(model), self.world_size)  # every gradient, once a step
        self.measuring = False
        self.local_norm: torch.Tensor | None = None
        return self.ddp

    def measure_local_grad_norm(self, on: bool) -> None:
        # On a desync check's step DDP leaves the gradients alone (no_sync) and after_backward reads this rank's
        # norm before averaging them itself: every other step keeps DDP's bucketed, overlapped all-reduce.
        self.measuring = on and self.world_size > 1
        self.local_norm = None

    def local_grad_norm(self) -> torch.Tensor | None:
        return self.local_norm

    def replicas_agree(self, final: bool) -> bool:
        return True  # DDP's replicas start from rank 0's weights and apply the same averaged gradient

    def micro_step(self, last: bool) -> contextlib.AbstractContextManager:
        # Only the step's last micro-batch all-reduces: the others accumulate gradients locally.
        return contextlib.nullcontext() if last and not self.measuring else self.ddp.no_sync()

    def after_backward(self, step: int) -> None:
        if not self.measuring:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        self.local_norm = torch.linalg.vector_norm(flat.double())
        dist.all_reduce(flat)
        flat.div_(self.world_size)
        for g, mean in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(mean)

    def synchronize(self, final: bool) -> None:
        self.comm.add(self.step_bytes)  # DDP's all-reduce already ran inside backward

    def eval_model(self, final: bool) -> torch.nn.Module:
        return self.ddp
