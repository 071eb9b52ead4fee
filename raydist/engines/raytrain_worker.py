"""The worker entry of every loop strategy: Ray Train's `train_loop_per_worker`, which runs the shared `Trainer`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from raydist import registry
from raydist.atomic import write_json_atomic
from raydist.config import Config
from raydist.driver import yielding


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker for every loop strategy: the registry names the `Strategy` class."""
    from raydist.engines.raytrain_trainer import note_placement_group
    from raydist.train.context import RayTrainContext
    from raydist.train.loop import Trainer

    entered = time.time()
    yielding.match_raylet_priority()  # the training at srun's priority, also on a cluster raydist did not start
    _threads_from_ray()
    cfg = Config.from_dict(config["config"])
    if not cfg.run.verbose:  # Ray Train's "Reporting training result ..." (its log level does not reach that one)
        from raydist.observability.console import quiet_ray_train_logs

        quiet_ray_train_logs()
    strategy = registry.get(config["strategy"]).load("worker")
    ctx = RayTrainContext(
        async_upload=cfg.checkpoint.async_upload, run_dir=cfg.run.run_dir, fit_id=config.get("fit_id", "")
    )
    if ctx.rank == 0:
        note_placement_group(cfg.run.run_dir)
    trainer = Trainer(cfg, ctx, strategy, entered)
    trainer.fit()
    if trainer.aborted and ctx.rank == 0:  # Ray Train keeps metrics only with checkpoints: say it in a file
        write_json_atomic(Path(cfg.run.run_dir) / FAILURE_FILE, {"reason": trainer.aborted})


FAILURE_FILE = "failure.json"
"""Written by rank 0 when the workers ended the run as failed without a checkpoint (a desync, on_desync=stop)."""


def _threads_from_ray() -> None:
    """torch's threads as Ray set them for this worker (OMP_NUM_THREADS, from the CPUs it holds), also where torch
    was imported before Ray set them: a worker forked by a warm interpreter (docs/running.md)."""
    import os

    import torch

    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))
