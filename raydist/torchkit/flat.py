"""A model's parameters and gradients as one flat vector each (one-shot exchange), split into contiguous slices (server shards)."""

from __future__ import annotations

import warnings

import numpy as np
import torch


def flatten_(module: torch.nn.Module, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-home the module's parameters and gradients as views of two flat buffers; returns (params, grads).

    Pulling a slice is then one copy into `params[a:b]`, pushing a slice is a view of `grads`, and a local
    update is one vector op; backward accumulates straight into the flat gradient buffer.
    """
    params = list(module.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params]).to(device or params[0].device)
    grads = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        p.grad = grads[offset : offset + n].view_as(p)
        offset += n
    return flat, grads


def slice_bounds(numel: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous slices of near-equal size covering 0..numel (the first ones one element longer)."""
    if parts > numel:
        raise ValueError(f"cannot split {numel} parameters into {parts} slices")
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over an array from Ray's object store without copying it.

    Arrays read from the object store are read-only views of shared memory; torch warns because it cannot
    mark a tensor read-only. Callers only read these tensors (a gradient, or parameters copied out).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)
