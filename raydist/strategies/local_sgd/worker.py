"""Local SGD: workers step on their own and average parameters every H steps (all-reduce or ring Polyak).

Sync points are every `local_sgd.sync_every` steps, every step of the synchronous warm-up, and the run's end,
so everything collective the loop does (reports, evaluation, checkpoints) happens there.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist

from raydist.torchkit.commstats import allreduce_bytes
from raydist.torchkit.flat import flatten_
from raydist.train.strategy import DesyncCheck, PerRankState, Strategy


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
    ops = [
        dist.P2POp(dist.isend, flat, (rank + 1) % world_size),
        dist.P2POp(dist.irecv, received, (rank - 1) % world_size),
    ]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    flat.mul_(1.0 - alpha).add_(received, alpha=alpha)


class LocalSGD(Strategy, PerRankState, DesyncCheck):  # between averagings each rank's model is its own
    name = "local_sgd"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        self.model = model
        self.lcfg = self.cfg.local_sgd
        self.params, self.grads = flatten_(model, self.ctx.device)  # one buffer each: averaging is one collective
        self.nbytes = self.params.numel() * self.params.element_size()
        self.since_sync = 0  # local steps since the last averaging
        self.step = 0
        self.local_norm: torch.Tensor | None = None
        return model

    def _warm(self, step: int) -> bool:
        return step < self.lcfg.warmup_sync_steps

    def after_backward(self, step: int) -> None:
        self.local_norm = None
        if self._warm(step) and self.world_size > 1:  # post-local SGD's first phase: gradients averaged
            self.local_norm = torch.linalg.vector_norm(self.grads)  # this rank's own, for the desync check
            with self.comm.waiting():
                average_allreduce(self.grads, self.world_size)
            self.comm.add(allreduce_bytes(self.nbytes, self.world_size))

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        self.grads.zero_()  # not zero_grad(set_to_none): the gradients must stay views of the flat buffer

    def after_step(self, step: int) -> None:
        self.step = step
        self.since_sync = 0 if self._warm(step - 1) else self.since_sync + 1

    def is_sync_point(self, step: int, final: bool) -> bool:
        return final or self._warm(step - 1) or self.since_sync >= self.lcfg.sync_every

    def synchronize(self, final: bool) -> None:
        W = self.world_size
        if not (self.since_sync >= self.lcfg.sync_every or (final and self.since_sync > 0)):
            return  # a warm-up step or a stop: nothing to average (a stop resumes from each rank's own model)
        if self.lcfg.averaging == "ring" and not final:
            ring_polyak(self.params, self.lcfg.alpha, self.ctx.rank, W)
            self.comm.add(2 * self.nbytes if W > 1 else 0)
        else:  # the end always takes the full mean: one final model
            average_allreduce(self.params, W)
            self.comm.add(allreduce_bytes(self.nbytes, W))
        self.since_sync = 0

    def global_step_loss(self) -> bool:
        return False  # between sync points there is no global model, so no global loss per step

    def local_grad_norm(self) -> torch.Tensor | None:
        return self.local_norm

    def replicas_agree(self, final: bool) -> bool:
        """Right after an all-reduce averaging (the end's always is one) or a synchronous warm-up step."""
        return (
            self.world_size == 1
            or self.since_sync == 0
            and (self.lcfg.averaging == "allreduce" or final or self.step <= self.lcfg.warmup_sync_steps)
        )

    def eval_model(self, final: bool) -> torch.nn.Module:
        """The workers' mean (the same as each worker's model right after an all-reduce)."""
        if self.replicas_agree(final):
            return self.model
        mean = copy.deepcopy(self.model)  # not build_model: that would draw from the RNG a resumed run restores
        flat, _ = flatten_(mean, self.ctx.device)
        average_allreduce(flat, self.world_size)
        return mean

    def state_dict(self) -> dict[str, Any]:
        return {"since_sync": self.since_sync}

    def load_state_dict(self, state: dict[str, Any], same_world: bool) -> None:
        self.since_sync = state.get("since_sync", 0) if same_world else 0

    def describe(self) -> str:
        return (
            f"averaging {self.lcfg.averaging} every {self.lcfg.sync_every} steps after "
            f"{self.lcfg.warmup_sync_steps} synchronous"
        )
