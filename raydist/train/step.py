"""The forward and backward of one optimizer step, shared by the loop's strategies and the async PS worker."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from raydist.config import Config
from raydist.factories import loss_function
from raydist.train.evaluation import autocast


def compute_gradients(
    model: torch.nn.Module,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    cfg: Config,
    device: torch.device,
    micro_step: Callable[[bool], contextlib.AbstractContextManager] = lambda last: contextlib.nullcontext(),
) -> torch.Tensor:
    """Accumulate the gradient of the mean loss over `micro_batches`; returns that loss (detached).

    Each micro-batch's loss is divided by their number, so the accumulated gradient is the step's mean.
    """
    accum = len(micro_batches)
    loss_fn = loss_function(cfg.train.loss)
    loss_sum = torch.zeros((), device=device)
    for i, (x, y) in enumerate(micro_batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with micro_step(i == accum - 1):
            with autocast(cfg, device):
                loss = loss_fn(model(x).float(), y) / accum
            loss.backward()
        loss_sum += loss.detach()
    return loss_sum
