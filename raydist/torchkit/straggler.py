"""Straggler injection: how long one worker sleeps after a step, the same policy in every strategy."""

from __future__ import annotations

import time

from raydist.config import StragglerConfig


def delay_s(cfg: StragglerConfig, rank: int, step: int, step_time_s: float) -> float:
    """Seconds worker `rank` sleeps after its own step `step` (1-based) that took `step_time_s` of real work.

    Sleeping (slowdown - 1) x the step's own time makes the worker `slowdown` times slower whatever the
    model or machine, so one setting means the same thing for sync DDP, local SGD and the async PS.
    """
    if rank != cfg.worker:
        return 0.0
    delay = (cfg.slowdown - 1.0) * step_time_s
    if cfg.pause_at_step and step == cfg.pause_at_step:
        delay += cfg.pause_s
    return delay


class Straggler:
    """A worker's view of the policy: call `after_step` once per step; it sleeps when this worker is the slow one."""

    def __init__(self, cfg: StragglerConfig, rank: int):
        self.cfg = cfg
        self.rank = rank
        self.slept_s = 0.0

    @property
    def active(self) -> bool:
        return self.rank == self.cfg.worker and (self.cfg.slowdown > 1.0 or self.cfg.pause_s > 0)

    def after_step(self, step: int, step_time_s: float) -> None:
        if not self.active:
            return
        delay = delay_s(self.cfg, self.rank, step, step_time_s)
        if delay > 0:
            time.sleep(delay)
            self.slept_s += delay
