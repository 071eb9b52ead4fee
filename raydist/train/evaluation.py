"""Shared by every strategy: mixed-precision context and the exact test-split evaluation."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset

from raydist.config import Config
from raydist.factories import loss_function
from raydist.torchkit.data import Splits
from raydist.train.context import WorkerContext


def autocast(cfg: Config, device: torch.device) -> contextlib.AbstractContextManager:
    mode = cfg.train.mixed_precision
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def _test_batches(data: Splits, ctx: WorkerContext, size: int = 512):
    """This rank's disjoint slice of the test split (no padding), in batches."""
    if isinstance(data.test, TensorDataset):  # the built-in sets: plain slicing, no per-sample calls
        xs, ys = data.test.tensors
        xs, ys = xs[ctx.rank :: ctx.world_size], ys[ctx.rank :: ctx.world_size]
        yield from ((xs[i : i + size], ys[i : i + size]) for i in range(0, len(ys), size))
        return
    # A generator of its own: iter(DataLoader) would otherwise draw a seed from the global RNG, and evaluation
    # must not shift the random stream that a resumed run restores.
    mine = Subset(data.test, range(ctx.rank, len(data.test), ctx.world_size))
    yield from DataLoader(mine, batch_size=size, generator=torch.Generator())


def _score(output: torch.Tensor, y: torch.Tensor, loss_path: str) -> tuple[float, float | None]:
    """A batch's summed loss (over its samples) and, for class scores against integer targets, its correct count."""
    if not loss_path and output.dim() == 2:
        loss_sum = F.cross_entropy(output.float(), y, reduction="sum").item()
    else:
        loss_sum = loss_function(loss_path)(output.float(), y).item() * len(y)
    classes = not y.is_floating_point() and output.shape[:-1] == y.shape
    return loss_sum, (output.argmax(dim=-1) == y).sum().item() if classes else None


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    data: Splits,
    cfg: Config,
    ctx: WorkerContext,
    all_reduce: Callable[[torch.Tensor], None] | None = None,
) -> dict[str, float | None]:
    """Test loss and accuracy over the whole test split: each rank scores a disjoint slice, sums are all-reduced
    (`all_reduce`: the loop's group; else torch.distributed's default one, when up). Accuracy counts argmax hits of
    class scores (per token for a sequence); None where targets are not classes."""
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=ctx.device)  # loss sum, correct, samples, targets scored
    for x, y in _test_batches(data, ctx):
        x, y = x.to(ctx.device), y.to(ctx.device)
        with autocast(cfg, ctx.device):
            output = model(x)
        loss_sum, correct = _score(output, y, cfg.train.loss)
        totals[0] += loss_sum
        totals[2] += len(y)
        if correct is not None:
            totals[1] += correct
            totals[3] += y.numel()
    if all_reduce is not None:
        all_reduce(totals)
    elif dist.is_initialized():
        dist.all_reduce(totals)
    model.train()
    accuracy = totals[1].item() / totals[3].item() if totals[3].item() else None
    return {"test_loss": totals[0].item() / totals[2].item(), "test_accuracy": accuracy}
