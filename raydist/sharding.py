"""Each worker's shard of the training split: its resumable sampler and loader, and the step counts they imply."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from raydist.config import Config
from raydist.errors import ConfigError
from raydist.sampler import ResumableDistributedSampler


def steps_per_epoch(num_train: int, world_size: int, batch_size: int, grad_accum: int = 1) -> int:
    """Optimizer steps per epoch on each worker, as DistributedSampler(drop_last=True) shards the split."""
    return (num_train // world_size // batch_size) // grad_accum


def check_fits(cfg: Config, num_train: int, world_size: int | None = None) -> None:
    """Refuse a batch that one worker's shard cannot fill (the drivers call it before any worker starts)."""
    world = world_size or cfg.scaling.num_workers
    if steps_per_epoch(num_train, world, cfg.train.batch_size, cfg.train.grad_accum) == 0:
        raise ConfigError(
            f"train.batch_size={cfg.train.batch_size} x train.grad_accum={cfg.train.grad_accum} exceeds the "
            f"{num_train // world} training samples each of {world} workers gets"
        )


def total_steps(cfg: Config, per_epoch: int) -> int:
    return cfg.train.max_steps or cfg.train.epochs * per_epoch


@dataclass
class Shard:
    sampler: ResumableDistributedSampler
    loader: DataLoader
    steps_per_epoch: int


def worker_shard(dataset: Dataset, cfg: Config, rank: int, world_size: int, loader_seed: int) -> Shard:
    """This rank's sample order (seed + epoch, as DistributedSampler) and a loader over it."""
    check_fits(cfg, len(dataset), world_size)
    sampler = ResumableDistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.train.seed, drop_last=True
    )
    # A generator of its own: otherwise each iter(loader) draws a seed from the global RNG, and a run
    # resumed mid-epoch (one more iter) would see different dropout masks from an uninterrupted one.
    loader = DataLoader(dataset, batch_size=cfg.train.batch_size, sampler=sampler, drop_last=True,
                        generator=torch.Generator().manual_seed(loader_seed))
    per_epoch = steps_per_epoch(len(dataset), world_size, cfg.train.batch_size, cfg.train.grad_accum)
    return Shard(sampler, loader, per_epoch)
