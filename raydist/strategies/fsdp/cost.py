"""FSDP's cost terms: an all-gather in forward and again in backward (reshard_after_forward) plus a
reduce-scatter: 3(n-1)/n x G with NCCL; 4(n-1)/n x G with gloo, whose reduce-scatter moves an all-reduce's bytes."""

from __future__ import annotations

from dataclasses import dataclass

from raydist.planning.costmodel import CostTerms, Setting


@dataclass(frozen=True)
class FSDPOptions:
    """What its step's cost depends on besides the shared setting (`Setting.options`)."""

    reshard_after_forward: bool = True
    """Gather the parameters again in backward (3 collectives of G per step instead of 2)."""


class FSDPCost(CostTerms):
    options = FSDPOptions

    def network_bytes(self, s: Setting) -> float:
        n = s.workers
        # The reduce-scatter: NCCL's moves (n-1)/n x G per rank; gloo's (torch 2.13) moves 2(n-1)/n x G, an
        # all-reduce's bytes (counted on loopback, 4 ranks: 6.0 x G in all, all-gather 3.0 x G).
        gathers, scatter = (2 if s.options.reshard_after_forward else 1), (2 if s.backend == "gloo" else 1)
        return (gathers + scatter) * (n - 1) / n * s.grad_bytes if n > 1 else 0.0

    def hops(self, s: Setting) -> float:
        return 3 * (s.workers - 1)
