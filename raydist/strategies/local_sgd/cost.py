"""Local SGD's cost terms: sync's base; the same all-reduce of the parameters every H steps (ring averaging: G to
one neighbour); and its checkpoints, in which every rank writes its own replica's state (sync writes one)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from raydist.planning.costmodel import CostTerms, Fit, Setting, ring_allreduce_bytes, setting_of, step_s

COMPUTES_LIKE = "sync"
"""The strategy whose base it shares: it computes what sync computes."""


@dataclass(frozen=True)
class LocalSGDOptions:
    """What its step's cost depends on besides the shared setting (`Setting.options`)."""

    sync_every: int = 8
    """Steps between two averagings (H)."""
    averaging: str = "allreduce"
    """allreduce, or ring (each worker sends its parameters to one neighbour)."""
    checkpoint_every: int = 0
    """Steps between two checkpoints (0: none). Its replicas differ, so every rank writes its own model and optimizer
    state, W copies where sync writes one; that extra cost is modelled. The others' checkpoints are in their fitted
    base (sync saves rank 0's copy, FSDP each rank's shard, async the driver's pull from the shards while workers go
    on)."""


@dataclass(frozen=True)
class LocalSGDFitted:
    """What is fitted of its own besides its base (`Fit.own_fits`)."""

    checkpoint_s: float = 0.0
    """Seconds per checkpoint at `Fit.base_params` (every rank writing its replica's state, rank 0 hashing them all,
    Ray copying them to storage); scaled by parameter count like the base. No network term: the replicas go to
    storage, not to other workers (on the emulated cluster storage is a local disk)."""


class LocalSGDCost(CostTerms):
    fit_phase = 1  # its base is sync's
    options = LocalSGDOptions
    fitted = LocalSGDFitted

    def network_bytes(self, s: Setting) -> float:
        g, n, o = s.grad_bytes, s.workers, s.options
        per_sync = (g if n > 1 else 0.0) if o.averaging == "ring" else ring_allreduce_bytes(g, n)
        return per_sync / o.sync_every

    def hops(self, s: Setting) -> float:
        return (1 if s.options.averaging == "ring" else 2 * (s.workers - 1)) / s.options.sync_every

    def extra_s(self, fit: Fit, s: Setting) -> float:
        """Its replicas' checkpoints, one every `checkpoint_every` steps."""
        every = s.options.checkpoint_every
        if not every:
            return 0.0
        return fit.fitted(s.strategy).checkpoint_s * s.params / fit.base_params / every

    def fitting_runs(self, runs: list[dict[str, Any]], low: float, top: float) -> list[dict[str, Any]]:
        # Its runs with checkpoints at the lowest and the highest rate: its checkpoints' cost (its base is sync's).
        checkpointed = [p for p in runs if p.get("checkpoint_every") and p.get("averaging", "allreduce") == "allreduce"]
        return [p for link in sorted({low, top}) for p in [q for q in checkpointed if q["link_mbit"] == link][:1]]

    def fit_into(self, result: Fit, mine: list[dict[str, Any]], top: float) -> None:
        if not mine or COMPUTES_LIKE not in result.base_s:
            return
        # What its checkpointed runs take beyond base and averaging is the replicas' checkpoints, which the links
        # do not carry: the mean over its runs.
        name = mine[0]["strategy"]
        result.base_s[name] = result.base_s[COMPUTES_LIKE]
        probe = Fit(result.efficiency, dict(result.base_s), result.base_params, result.latency_s)
        per_ckpt = [
            (1 / p["steps_per_s"] - step_s(probe, setting_of(p).with_options(checkpoint_every=0)))
            * setting_of(p).options.checkpoint_every
            * result.base_params
            / p["params"]
            for p in mine
        ]
        result.set_fitted(name, checkpoint_s=max(0.0, statistics.fmean(per_ckpt)))

    def label(self, p: dict[str, Any]) -> str:
        return (", ring" if p.get("averaging") == "ring" else "") + (
            ", a checkpoint every epoch" if p.get("checkpoint_every") else ", no checkpoint but the last"
        )
