"""Local SGD's config section (`local_sgd.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raydist.typedconfig import opt


@dataclass
class LocalSGDConfig:
    """jobs/local_sgd.py: workers step on their own and average parameters every `sync_every` steps."""

    sync_every: int = opt(8, "local steps between two averagings (H)", ge=1)
    averaging: Literal["allreduce", "ring"] = opt(
        "allreduce",
        "allreduce: every worker takes the mean of all; ring: each mixes in its left neighbour's parameters (Polyak, `alpha`)",
    )
    alpha: float = opt(0.5, "ring: weight of the neighbour's parameters, p <- (1 - alpha) p + alpha p_left", gt=0, le=1)
    warmup_sync_steps: int = opt(
        0, "fully synchronous steps (gradients all-reduced every step) before local SGD starts (post-local SGD)", ge=0
    )
