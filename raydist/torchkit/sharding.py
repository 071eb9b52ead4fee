"""Each worker's shard of the training split: its resumable sampler and loader, and the step counts they imply."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raydist.config import Config
from raydist.errors import ConfigError
from raydist.torchkit.checkpoint import Progress

if TYPE_CHECKING:  # torch is imported where a shard is built: the driver's check_fits needs none
    from torch.utils.data import DataLoader, Dataset

    from raydist.torchkit.sampler import ResumableDistributedSampler


def steps_per_epoch(num_train: int, world_size: int, batch_size: int, grad_accum: int = 1) -> int:
    """Optimizer steps per epoch on each worker, as DistributedSampler(drop_last=True) shards the split."""
    return (num_train // world_size // batch_size) // grad_accum


def check_fits(cfg: Config, num_train: int, world_size: int | None = None) -> None:
    """Refuse a batch that one worker's shard cannot fill (the drivers call it before any worker starts)."""
    world = world_size or cfg.scaling.max_workers
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

    def steps(self, progress: Progress, accum: int, finished: Callable[[], bool]) -> Iterator[list]:
        """Each optimizer step's `accum` micro-batches, from where `progress` stands, epoch after epoch.

        The caller advances progress.step and progress.micro_in_epoch after each step; the epoch rolls over here,
        after the caller is done with an epoch's last step (and its checkpoint, which so records the epoch's end).
        A step the caller drops (a fault-tolerant strategy's uncommitted one) leaves progress where it was, and a
        replacement worker's progress may jump to a peer's: the loader is then re-seated where progress stands.
        """
        per_epoch = self.steps_per_epoch * accum
        while not finished():
            self.sampler.set_epoch(progress.epoch, start=progress.micro_in_epoch * self.loader.batch_size)
            batches = iter(self.loader)
            while not finished() and progress.micro_in_epoch < per_epoch:
                at = (progress.epoch, progress.micro_in_epoch)
                try:
                    group = [next(batches) for _ in range(accum)]
                except StopIteration:  # dropped steps used up the epoch's batches
                    break
                yield group
                if progress.epoch != at[0] or progress.micro_in_epoch not in (at[1], at[1] + accum):
                    break  # progress moved under the loader (a peer's state taken)
            if progress.micro_in_epoch >= per_epoch:
                progress.epoch += 1
                progress.micro_in_epoch = 0


def worker_shard(dataset: Dataset, cfg: Config, rank: int, world_size: int, loader_seed: int) -> Shard:
    """This rank's sample order (seed + epoch, as DistributedSampler) and a loader over it."""
    import torch
    from torch.utils.data import DataLoader

    from raydist.torchkit.sampler import ResumableDistributedSampler

    check_fits(cfg, len(dataset), world_size)
    sampler = ResumableDistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=cfg.train.seed, drop_last=True
    )
    # A generator of its own: otherwise each iter(loader) draws a seed from the global RNG, and a run
    # resumed mid-epoch (one more iter) would see different dropout masks from an uninterrupted one.
    loader = DataLoader(
        dataset,
        batch_size=cfg.train.batch_size,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator().manual_seed(loader_seed),
    )
    per_epoch = steps_per_epoch(len(dataset), world_size, cfg.train.batch_size, cfg.train.grad_accum)
    return Shard(sampler, loader, per_epoch)
