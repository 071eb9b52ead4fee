"""Shared by every strategy: mixed-precision context and the exact test-split evaluation."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from raydist.config import Config
from raydist.context import WorkerContext
from raydist.data import Splits


def autocast(cfg: Config, device: torch.device) -> contextlib.AbstractContextManager:
    mode = cfg.train.mixed_precision
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Splits, cfg: Config, ctx: WorkerContext) -> dict[str, float]:
    """Test loss and accuracy over the whole test split: each rank scores a disjoint slice, sums are all-reduced."""
    model.eval()
    # Plain slicing rather than a DataLoader: iter(DataLoader) draws from the global RNG, and evaluation
    # must not shift the random stream that a resumed run restores.
    xs, ys = data.test.tensors
    xs, ys = xs[ctx.rank :: ctx.world_size], ys[ctx.rank :: ctx.world_size]  # disjoint, no padding
    totals = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss sum, correct, count
    for i in range(0, len(ys), 512):
        x, y = xs[i : i + 512].to(ctx.device), ys[i : i + 512].to(ctx.device)
        with autocast(cfg, ctx.device):
            logits = model(x)
        totals[0] += F.cross_entropy(logits.float(), y, reduction="sum").item()
        totals[1] += (logits.argmax(dim=1) == y).sum().item()
        totals[2] += len(y)
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    return {"test_loss": totals[0].item() / totals[2].item(), "test_accuracy": totals[1].item() / totals[2].item()}
