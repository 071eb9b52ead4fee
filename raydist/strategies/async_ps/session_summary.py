"""The JobSummary of an async PS session that trained to its end: the run's state and the server shards' books."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from raydist.config import Config
from raydist.strategies.async_ps import STRATEGY
from raydist.strategies.async_ps.progress import Progress
from raydist.strategies.async_ps.training import Ending
from raydist.summary import JobSummary
from raydist.torchkit.commstats import per_worker_summary


@dataclass(frozen=True)
class Session:
    """What the driver knows of the session beside its progress."""

    ray_address: str
    wall_s: float
    total_steps: int
    resumed_from: int | None
    start_done: dict[int, int]  # each worker's position in its shard of the data when the session began
    restarts: int
    stop_reason: str | None


def summarise(cfg: Config, session: Session, progress: Progress, end: Ending) -> JobSummary:
    train_s = progress.train_time_s
    staleness: Counter = Counter()
    for st in end.stats:
        staleness.update({int(k): v for k, v in st["staleness"].items()})
    updates = sum(staleness.values())
    # Steps that count, from shard 0's books: a restart's recomputed steps are not counted twice, and the
    # workers that died cannot report theirs.
    steps_per_worker = [end.stats[0]["done"].get(k, 0) - session.start_done.get(k, 0) for k in range(len(end.reports))]
    finished = progress.steps >= session.total_steps
    return JobSummary(
        strategy=STRATEGY,
        run_name=cfg.run.name,
        run_dir=cfg.run.run_dir,
        ray=session.ray_address,
        workers=len(end.reports),
        status="completed" if finished else "stopped",
        steps=progress.steps,
        total_steps=session.total_steps,
        resumed_from_step=session.resumed_from,
        wall_s=session.wall_s,
        train_time_s=train_s,
        test_accuracy=progress.scores["test_accuracy"],
        test_loss=progress.scores["test_loss"],
        final_loss=progress.final_loss(),
        samples_per_s=sum(steps_per_worker) * cfg.train.batch_size / train_s,
        steps_per_s=sum(steps_per_worker) / train_s,
        checkpoint=end.checkpoint,
        metrics_file=progress.log.path,
        **per_worker_summary([{"bytes": r.bytes, "wait_s": r.wait_s} for r in end.reports]),
        servers=len(end.server_hosts),
        server_hosts=end.server_hosts,
        staleness_mean=sum(k * v for k, v in staleness.items()) / updates if updates else 0.0,
        staleness_max=max(staleness, default=0),
        dropped=sum(st["dropped"] for st in end.stats),
        steps_per_worker=steps_per_worker,
        restarts=session.restarts,
        stop_reason=None if finished else session.stop_reason or f"train.stop_at_step={cfg.train.stop_at_step}",
    )
