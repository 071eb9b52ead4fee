"""The `wait` staleness bound: admission before each step, so no gradient is ever applied more than B versions stale.

A worker takes a ticket before computing a gradient and hands it back once the gradient is applied on every
shard. `released` counts tickets handed back, so parameters fetched after reading it are at least that new on
every shard. A gradient whose parameters are `r` tickets old can only be overtaken by tickets issued while it is
out, so issuing a ticket only while `issued - min(r of every ticket out) <= B` bounds every staleness by B.
Workers never block while holding a ticket (their pushes always apply), so tickets come back and nobody
deadlocks; a worker whose own parameters are too old to ever qualify is told to fetch fresh ones instead.
"""

from __future__ import annotations

import asyncio


class StalenessGate:
    """An asyncio actor: `acquire` waits without blocking the other workers' calls."""

    def __init__(self, bound: int):
        self.bound = bound
        self.issued = 0
        self.released = 0
        self.out: dict[int, int] = {}  # worker -> `released` count its parameters are at least as new as
        self.changed = asyncio.Condition()

    async def acquire(self, worker: int, base: int | None) -> int | None:
        """A ticket for a gradient on parameters of age `base` (None: the worker fetches right after this call).

        Returns the base to remember for later steps, or None when the worker must fetch first.
        """
        async with self.changed:
            while True:
                if base is not None and self.issued - base > self.bound:
                    return None  # waiting cannot make these parameters any newer
                mine = self.released if base is None else base
                if self.issued - min([mine, *self.out.values()]) <= self.bound:
                    self.issued += 1
                    self.out[worker] = mine
                    return mine
                await self.changed.wait()

    async def release(self, worker: int) -> None:
        """The worker's ticket is done with: its gradient is applied on every shard, or it never pushed one."""
        async with self.changed:
            if self.out.pop(worker, None) is not None:
                self.released += 1
                self.changed.notify_all()
