"""The async PS driver's evaluation: the servers' current parameters, scored on the test split in the driver."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from raydist.config import Config
from raydist.strategies.async_ps.messages import PullReply
from raydist.torchkit.flat import as_tensor, flatten_
from raydist.torchkit.models import build_model
from raydist.train.evaluation import evaluate


class Evaluator:
    """Scores the servers' current parameters on the test split, here in the driver."""

    def __init__(self, cfg: Config, data, bounds: list[tuple[int, int]]):
        self.cfg, self.data, self.bounds = cfg, data, bounds
        self.model = build_model(cfg.model, data)
        self.params, _ = flatten_(self.model)
        self.ctx = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))

    def __call__(self, replies: list[PullReply]) -> dict[str, float]:
        """`replies`: every shard's `pull`, in shard order."""
        for (a, b), reply in zip(self.bounds, replies):
            self.params[a:b].copy_(as_tensor(reply.params))
        return evaluate(self.model, self.data, self.cfg, self.ctx)
