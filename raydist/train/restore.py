"""The loop's checkpoints: which of a checkpoint's files a rank reads back, and which it writes.

Three layouts, by the strategy's capabilities: one model for all (rank 0 writes it), every rank's own model and
optimizer (`PerRankState`: local SGD's replicas differ between averagings), or every rank's shard (`ShardedState`:
FSDP's, through DCP). Rank 0 always writes the loop's state file and, last, the manifest covering every rank's files.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

import torch

from raydist.config import Config
from raydist.errors import RaydistError
from raydist.torchkit.checkpoint import (
    Progress,
    load_replica,
    load_state,
    rng_state,
    save_replica,
    save_state,
    set_rng_state,
)
from raydist.torchkit.seeding import reseed
from raydist.train.collectives import Collectives
from raydist.train.context import WorkerContext, new_checkpoint_dir
from raydist.train.strategy import PerRankState, ShardedState, Strategy


@dataclass
class TrainState:
    """What a checkpoint or a live peer gives back: the loop reads these through here, never a copy of its own."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    progress: Progress


class Restorer:
    """Restores a rank's `TrainState` (from the run's latest checkpoint, or a live peer's) and saves it, in the layout
    the strategy's capabilities ask for."""

    def __init__(self, cfg: Config, ctx: WorkerContext, strategy: Strategy, coll: Collectives, state: TrainState):
        self.cfg, self.ctx, self.strategy, self.coll, self.state = cfg, ctx, strategy, coll, state
        self.sharded = isinstance(strategy, ShardedState)
        self.per_rank = isinstance(strategy, PerRankState)
        self.saved_at: int | None = None
        """The step of this session's newest checkpoint."""

    def restore(self) -> int | None:
        """Load the latest checkpoint if the run has one; returns the step it resumes from, or None."""
        s, rank = self.state, self.ctx.rank
        with self.ctx.latest_checkpoint() as directory:
            if directory is None:
                return None
            saved = load_state(directory)
            extra = saved["extra"]
            same_world = extra["world_size"] == self.ctx.world_size
            replicas = extra.get("replicas", 0)  # every rank wrote its own model and optimizer (save_replica)
            sharded = saved["model"] is None and not replicas  # a sharded strategy's ranks wrote their parts
            if sharded != self.sharded:
                raise RaydistError(
                    f"checkpoint {os.path.basename(os.path.normpath(directory))} holds a "
                    f"{'sharded' if sharded else 'full'} model written by {extra.get('strategy_name')}, which "
                    f"{self.strategy.name} cannot resume from: use a new run.name"
                )
            if sharded:  # every rank reads its part while the directory is at hand (DCP reshards for another W)
                self.strategy.load_sharded(directory, s.optimizer)
            elif replicas:  # each rank takes back its own; another world size, or one model for all: rank 0's
                self._load_model(load_replica(directory, rank if same_world and self.per_rank else 0))
        if not (sharded or replicas):  # one model for all (an older local SGD checkpoint: rank 0's)
            self._load_model(saved)
        s.scheduler.load_state_dict(saved["scheduler"])
        self.strategy.load_state_dict(extra.get("strategy", {}), same_world)
        s.progress = saved["progress"]
        if same_world:
            set_rng_state(saved["rng_per_rank"][rank])
        else:  # a different worker count changes the sample order anyway: only reseed
            reseed(self.cfg.train.seed, rank, s.progress.step)
        return s.progress.step

    def _load_model(self, saved: dict[str, Any]) -> None:
        self.state.model.load_state_dict(saved["model"])
        self.state.optimizer.load_state_dict(saved["optimizer"])

    def live_state(self) -> dict[str, Any]:
        """What a replacement worker takes from a live peer to go on in step with it (`FaultTolerant.share_state`)."""
        s = self.state
        return {
            "model": s.model.state_dict(),
            "optimizer": s.optimizer.state_dict(),
            "scheduler": s.scheduler.state_dict(),
            "strategy": self.strategy.state_dict(),
            "progress": dataclasses.asdict(s.progress),
        }

    def take_live_state(self, live: dict[str, Any]) -> None:
        """A peer's `live_state`, taken in the middle of a step: progress is changed in place, where the data
        iterator reads it."""
        s = self.state
        self._load_model(live)
        s.scheduler.load_state_dict(live["scheduler"])
        self.strategy.load_state_dict(live["strategy"], same_world=True)
        for key, value in live["progress"].items():
            setattr(s.progress, key, value)

    def save(self, metrics: dict[str, Any]) -> float:
        """Every rank calls it at the same sync point; each writes its own part if the strategy has one, rank 0 the
        rest and the manifest, then all report it to Ray Train together. Returns the seconds it took."""
        s, rank = self.state, self.ctx.rank
        rngs = self.coll.all_gather_object(rng_state())
        directory = None
        began = time.perf_counter()
        if self.sharded or self.per_rank:  # every rank writes its part into one directory on the shared storage
            directory = self._shared_staging_dir()
            if self.sharded:
                self.strategy.save_sharded(directory, s.optimizer)
            else:
                save_replica(directory, rank, s.model, s.optimizer)
                self.coll.barrier()  # every replica's file is written before rank 0's manifest
        if rank == 0:
            directory = directory or new_checkpoint_dir()
            self._save_state(directory, rngs)
        self.ctx.report(
            metrics, directory if rank == 0 else None, s.progress.step, on_storage=self.sharded or self.per_rank
        )
        self.saved_at = s.progress.step
        return time.perf_counter() - began

    def _save_state(self, directory: str, rngs: list[Any]) -> None:
        """Rank 0's part, last: the manifest then covers every rank's files (all written by now)."""
        s, W = self.state, self.ctx.world_size
        extra = {
            "config": self.cfg.to_dict(),
            "world_size": W,
            "strategy_name": self.strategy.name,
            "strategy": self.strategy.state_dict(),
            **({"replicas": W} if self.per_rank else {}),
        }
        own = not (self.sharded or self.per_rank)
        save_state(
            directory,
            model=s.model if own else None,
            optimizer=s.optimizer if own else None,
            scheduler=s.scheduler,
            progress=s.progress,
            rng_per_rank=rngs,
            extra=extra,
        )

    def _shared_staging_dir(self) -> str:
        """Where every rank writes its part of this step's checkpoint: in the run directory, which all ranks share
        (a temp directory is node-local). Rank 0 empties it of a killed save's leftovers before anyone writes; the
        finished directory is then renamed into place and recorded where it is (`report(on_storage=True)`)."""
        path = os.path.join(self.cfg.run.run_dir, f".staging-checkpoint_step{self.state.progress.step:08d}")
        if self.ctx.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
        self.coll.barrier()
        return path
