"""FSDP's cost terms: an all-gather in forward and again in backward (reshard_after_forward) plus a
reduce-scatter: 3(n-1)/n x G with NCCL; 4(n-1)/n x G with gloo, whose reduce-scatter moves an all-reduce's bytes."""

from __future__ import annotations

from raydist.planning.costmodel import CostTerms, Setting


class FSDPCost(CostTerms):
    def network_bytes(self, s: Setting) -> float:
        n = s.workers
        gathers, scatter = (2 if s.reshard_after_forward else 1), (2 if s.backend == "gloo" else 1)
        return (gathers + scatter) * (n - 1) / n * s.grad_bytes if n > 1 else 0.0

    def hops(self, s: Setting) -> float:
        return 3 * (s.workers - 1)
