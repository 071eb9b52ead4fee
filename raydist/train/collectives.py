"""The shared loop's own collectives (its sync point's vote, the checkpoint's RNG gather, evaluation's sums), over the
group a strategy names: torch.distributed's default group, or a fault-tolerant strategy's own (torchft's, whose
members change between steps and which torch.distributed does not know)."""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist


class Collectives:
    """torch.distributed's default process group, when one is up and holds more than one rank."""

    def __init__(self, world_size: int, rank: int):
        self.world_size, self.rank = world_size, rank

    @property
    def active(self) -> bool:
        return self.world_size > 1 and dist.is_initialized()

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over every rank, in place."""
        if self.active:
            dist.all_reduce(tensor)

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        if not self.active:
            return [obj]
        every: list[Any] = [None] * self.world_size
        dist.all_gather_object(every, obj)
        return every

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


class SumOnlyCollectives(Collectives):
    """Everything from one primitive, a sum over the group (`_sum`): a group that offers no more."""

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, tensor: torch.Tensor) -> None:
        if self.active:
            self._sum(tensor)

    def _sum(self, tensor: torch.Tensor) -> None:
        raise NotImplementedError

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Each rank pickles its object into its own row of a zeroed buffer; one sum fills every row."""
        if not self.active:
            return [obj]
        mine = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
        sizes = torch.zeros(self.world_size, dtype=torch.int64)
        sizes[self.rank] = mine.numel()
        self._sum(sizes)
        rows = torch.zeros(self.world_size, int(sizes.max()), dtype=torch.int32)  # int32: sums of bytes cannot wrap
        rows[self.rank, : mine.numel()] = mine.to(torch.int32)
        self._sum(rows)
        return [
            pickle.loads(rows[r, : int(sizes[r])].to(torch.uint8).numpy().tobytes()) for r in range(self.world_size)
        ]

    def barrier(self) -> None:
        if self.active:
            self._sum(torch.zeros(1))
