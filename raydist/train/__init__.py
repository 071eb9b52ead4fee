"""The worker side of training: the one loop (`Trainer`) and what a strategy plugs into it (`Strategy`)."""

from raydist.train.loop import Trainer
from raydist.train.strategy import Strategy

__all__ = ["Strategy", "Trainer"]
