"""Per-worker communication accounting shared by the strategies: payload bytes and time spent waiting on others."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters (= of its gradients): what one full exchange of the model moves."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def allreduce_bytes(nbytes: int, world_size: int) -> float:
    """Bytes one worker sends plus receives in a ring all-reduce of `nbytes`: 2 (W-1)/W nbytes each way."""
    return 4.0 * (world_size - 1) / world_size * nbytes


class CommStats:
    """Counts one worker's payload bytes (sent + received, by the algorithm's volume, not wire bytes) and waiting time."""

    def __init__(self) -> None:
        self.bytes = 0.0
        self.wait_s = 0.0

    def add(self, nbytes: float) -> None:
        self.bytes += nbytes

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Time a call in which this worker can only wait for others (a collective, a fetch)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.wait_s += time.perf_counter() - start

    def as_dict(self) -> dict[str, float]:
        return {"bytes": self.bytes, "wait_s": self.wait_s}


def per_worker_summary(per_worker: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "bytes_per_worker": [round(w["bytes"]) for w in per_worker],
        "wait_s_per_worker": [round(w["wait_s"], 3) for w in per_worker],
    }
