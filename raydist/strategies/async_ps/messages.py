"""What travels between the PS driver, its workers and its server shards, with one name per quantity."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class PullReply(NamedTuple):
    """A server shard's answer to `pull`."""

    version: int
    """Updates applied to this shard's slice so far: the base version of the gradients computed on `params`."""
    params: np.ndarray
    """The slice's parameters at `version`."""
    granted: int
    """Steps of the session's budget granted to the caller by this pull (shard 0 only; 0 from the others)."""
    lr: float
    """The learning rate the shard applies now (its schedule position), for the worker's local Downpour steps."""


class Drained(NamedTuple):
    """Shard 0's answer to `drain`: the update records since the last call and the steps done in total."""

    records: list[dict[str, Any]]
    steps_done: int


class WorkerReport(NamedTuple):
    """What a worker returns when the budget is spent."""

    rank: int
    steps: int
    samples: int
    dropped: int
    train_time_s: float
    bytes: float
    wait_s: float
