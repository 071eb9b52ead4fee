"""What the ranks agree on at a sync point, without clocks of their own: one small all-reduce (`Votes`) carries the
loss, rank 0's "time to report" vote, rank 0's stop poll and, at a desync check, every rank's fingerprint; `Stops`
turns the stop vote into the same decision on every rank."""

from __future__ import annotations

from collections.abc import Callable

import torch

from raydist.train import desync
from raydist.train.collectives import Collectives
from raydist.train.context import WorkerContext

_LOSS_SUM, _LOSS_STEPS, _STEP_LOSS, _REPORT, _POLLED, _STOP = range(6)
_FINGERPRINTS = 6  # then desync.SLOTS per rank, filled at a desync check


class Votes:
    """The sync point's one all-reduce: each rank fills its slots, `count` sums them, and every rank reads back the
    same values."""

    def __init__(self, world_size: int, device: torch.device, window: torch.Tensor, step_loss: torch.Tensor):
        """`window`: this rank's loss sum and steps since the last report; `step_loss`: this step's loss sum."""
        self.world_size = world_size
        self.tensor = torch.zeros(_FINGERPRINTS + desync.SLOTS * world_size, device=device, dtype=torch.float64)
        self.tensor[_LOSS_SUM], self.tensor[_LOSS_STEPS] = window[0], window[1]
        self.tensor[_STEP_LOSS] = step_loss.float()

    def vote_report(self) -> None:
        self.tensor[_REPORT] = 1.0

    def vote_poll(self, stop: bool) -> None:
        self.tensor[_POLLED] = 1.0
        self.tensor[_STOP] = float(stop)

    def fingerprint(self, rank: int, grad_norm: torch.Tensor, checksum: torch.Tensor) -> None:
        row = _FINGERPRINTS + desync.SLOTS * rank
        self.tensor[row] = grad_norm
        self.tensor[row + 1] = checksum

    def count(self, coll: Collectives) -> None:
        coll.all_reduce(self.tensor)

    def mean_loss(self) -> float:
        """Over every rank's steps since the last report."""
        return (self.tensor[_LOSS_SUM] / self.tensor[_LOSS_STEPS]).item()

    def step_loss(self) -> float:
        """This step's mean over the ranks."""
        return self.tensor[_STEP_LOSS].item() / self.world_size

    def report(self) -> bool:
        return self.tensor[_REPORT].item() > 0

    def polled(self) -> bool:
        return self.tensor[_POLLED].item() > 0

    def stop(self) -> bool:
        return self.tensor[_STOP].item() > 0

    def fingerprints(self) -> list[list[float]]:
        """Per rank, in rank order: its local gradient norm and parameter checksum."""
        return self.tensor[_FINGERPRINTS:].view(self.world_size, desync.SLOTS).tolist()


class Stops:
    """Whether the run stops at a sync point short of its end, alike on every rank."""

    def __init__(self, ctx: WorkerContext, stop_at_step: int):
        self.ctx, self.stop_at_step = ctx, stop_at_step
        self.requests: list[Callable[[], str | None]] = [ctx.stop_request]
        """Polled on rank 0 when the schedule says a stop poll is due, at a sync point; the first reason any returns
        makes every rank checkpoint there and stop (the preemption and desync checks hook in here)."""
        self.reason: str | None = None
        self.stopped = False

    def poll(self) -> bool:
        """Rank 0's vote: whether any request asks for a stop (it alone knows why)."""
        self.reason = next(filter(None, (request() for request in self.requests)), None)
        return self.reason is not None

    def at_limit(self, step: int) -> bool:
        """train.stop_at_step is reached."""
        return bool(self.stop_at_step and step >= self.stop_at_step)

    def agree(self, polled: bool, stop: bool, step: int, at_end: bool) -> bool:
        """From the votes every rank read back: whether the run stops at `step` (not its last); sets `reason`."""
        if polled and not stop:
            self.reason = self.ctx.preemption()  # Ray's own path; every rank asks at the same sync point
        elif stop:
            self.reason = self.reason or "stop requested"  # rank 0 knows why
        if self.at_limit(step) and not self.reason:
            self.reason = f"train.stop_at_step={self.stop_at_step}"
        self.stopped = not at_end and self.reason is not None
        return self.stopped
