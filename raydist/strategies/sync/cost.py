"""Sync DDP's cost terms: a ring all-reduce of the gradients every step, 2(n-1)/n x G each way per worker.

Its runs at two link rates give the link efficiency every strategy's prediction uses."""

from __future__ import annotations

from typing import Any

from raydist.planning.costmodel import CostTerms, Setting, ring_allreduce_bytes


class SyncCost(CostTerms):
    efficiency_reference = True

    def network_bytes(self, s: Setting) -> float:
        return ring_allreduce_bytes(s.grad_bytes, s.workers)

    def hops(self, s: Setting) -> float:
        return 2 * (s.workers - 1)

    def fitting_runs(self, runs: list[dict[str, Any]], low: float, top: float) -> list[dict[str, Any]]:
        # One run at every rate: the lowest and the highest give the efficiency, the top one the base.
        return [next(p for p in runs if p["link_mbit"] == link) for link in sorted({p["link_mbit"] for p in runs})]
