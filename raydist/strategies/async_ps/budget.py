"""How long an async PS run is, in steps, and how often it evaluates and checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

from raydist.config import Config
from raydist.torchkit import sharding


@dataclass(frozen=True)
class Budget:
    """The run's length in steps; a step is one worker's gradient update, so the sample budget matches sync DDP's,
    where one step takes a batch from every worker."""

    total: int
    """Steps the whole run takes (the LR schedule spans them)."""
    session: int
    """Steps shard 0 grants in this session: `total`, or fewer when the run stops early (train.stop_at_step)."""
    per_epoch: int
    """An epoch's worth of steps, spread over the workers: the evaluation period."""
    checkpoint_every: int

    @classmethod
    def of(cls, cfg: Config, num_train: int) -> Budget:
        W = cfg.scaling.max_workers
        per_worker_epoch = sharding.steps_per_epoch(num_train, W, cfg.train.batch_size)  # as sync's, per worker
        total = W * (cfg.train.max_steps or cfg.train.epochs * per_worker_epoch)
        session = min(total, cfg.train.stop_at_step) if cfg.train.stop_at_step else total
        per_epoch = W * per_worker_epoch
        return cls(total, session, per_epoch, cfg.checkpoint.every_steps or per_epoch)
