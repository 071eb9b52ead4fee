"""The worker side of training: the one loop (`Trainer`) and what a strategy plugs into it (`Strategy`).

Imported lazily: Ray Train's controller imports this package (for raydist.engines.raytrain_backend) and needs no torch."""

__all__ = ["Strategy", "Trainer"]


def __getattr__(name: str):
    if name == "Trainer":
        from raydist.train.loop import Trainer

        return Trainer
    if name == "Strategy":
        from raydist.train.strategy import Strategy

        return Strategy
    raise AttributeError(f"module 'raydist.train' has no attribute {name!r}")
