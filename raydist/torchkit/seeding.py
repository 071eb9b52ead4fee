"""The one rule for a worker's random stream when it cannot be restored bit for bit (fresh PS worker, new world size)."""

from __future__ import annotations

import numpy as np
import torch


def stream_seed(seed: int, rank: int, step: int) -> int:
    """A seed distinct for every (run seed, rank, step): no two workers, and no two resumes, share dropout masks.

    SeedSequence mixes the three numbers, so unlike sums such as seed*1000 + rank + step no two triples collide.
    """
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def reseed(seed: int, rank: int, step: int) -> None:
    torch.manual_seed(stream_seed(seed, rank, step))
