"""Local SGD's cost terms: sync's base; the same all-reduce of the parameters every H steps (ring averaging: G to
one neighbour); and its checkpoints, in which every rank writes its own replica's state (sync writes one)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from raydist.planning.costmodel import CostTerms, Fit, Setting, ring_allreduce_bytes, setting_of, step_s

COMPUTES_LIKE = "sync"
"""The strategy whose base it shares: it computes what sync computes."""


class LocalSGDCost(CostTerms):
    fit_phase = 1  # its base is sync's

    def network_bytes(self, s: Setting) -> float:
        g, n = s.grad_bytes, s.workers
        per_sync = (g if n > 1 else 0.0) if s.averaging == "ring" else ring_allreduce_bytes(g, n)
        return per_sync / s.sync_every

    def hops(self, s: Setting) -> float:
        return (1 if s.averaging == "ring" else 2 * (s.workers - 1)) / s.sync_every

    def checkpoint_s(self, fit: Fit, s: Setting) -> float:
        if not s.checkpoint_every:
            return 0.0
        return fit.checkpoint_s * s.params / fit.base_params

    def fitting_runs(self, runs: list[dict[str, Any]], low: float, top: float) -> list[dict[str, Any]]:
        # Its runs with checkpoints at the lowest and the highest rate: its checkpoints' cost (its base is sync's).
        checkpointed = [p for p in runs if p.get("checkpoint_every") and p.get("averaging", "allreduce") == "allreduce"]
        return [p for link in sorted({low, top}) for p in [q for q in checkpointed if q["link_mbit"] == link][:1]]

    def fit_into(self, result: Fit, mine: list[dict[str, Any]], top: float) -> None:
        if not mine or COMPUTES_LIKE not in result.base_s:
            return
        # What its checkpointed runs take beyond base and averaging is the replicas' checkpoints, which the links
        # do not carry: the mean over its runs.
        result.base_s[mine[0]["strategy"]] = result.base_s[COMPUTES_LIKE]
        probe = Fit(result.efficiency, dict(result.base_s), result.base_params, result.latency_s)
        per_ckpt = [
            (1 / p["steps_per_s"] - step_s(probe, replace(setting_of(p), checkpoint_every=0)))
            * setting_of(p).checkpoint_every
            * result.base_params
            / p["params"]
            for p in mine
        ]
        result.checkpoint_s = max(0.0, statistics.fmean(per_ckpt))

    def label(self, p: dict[str, Any]) -> str:
        return (", ring" if p.get("averaging") == "ring" else "") + (
            ", a checkpoint every epoch" if p.get("checkpoint_every") else ", no checkpoint but the last"
        )
