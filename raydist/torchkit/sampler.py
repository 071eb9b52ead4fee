"""A DistributedSampler that can start part-way through an epoch, so a resumed run sees the same sample order."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler


class ResumableDistributedSampler(DistributedSampler):
    """DistributedSampler whose epoch can begin at sample `start` of this rank's order.

    The order itself is DistributedSampler's (seed + epoch), so skipping is exact and costs no data loading.
    `start` applies to the next epoch set with `set_epoch` only; later epochs start at 0.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start
