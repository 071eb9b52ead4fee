"""The async PS's cost terms. No step waits for another worker, so the cluster's rate in steps/s is the lower of
what the workers can do (base, a cost per shard, their own pushes and fetches) and what the busiest link carries
(`ps_link_bound`: the fan-in), at the efficiency Ray's object transfers get."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raydist.planning.costmodel import CostTerms, Fit, Setting, base_for, rate_bytes_per_s, setting_of
from raydist.strategies.async_ps.placement import shard_nodes


@dataclass(frozen=True)
class AsyncPSOptions:
    """What its step's cost depends on besides the shared setting (`Setting.options`)."""

    servers: int = 1
    """Parameter-server shards (async_ps.server_placement=spread)."""


@dataclass(frozen=True)
class AsyncPSFitted:
    """What is fitted of its own besides its base (`Fit.own_fits`)."""

    ps_efficiency: float = 0.0
    """The share of a link Ray's object transfers get (fitted on the one-shard run at the slowest link, which the
    busiest link bounds); 0 = `Fit.efficiency`."""
    per_shard_s: float = 0.0
    """What each server shard adds to a worker's step besides its bytes (a push and a fetch call: Ray's cost per
    call, and on the emulated cluster the shard's process competing for the same cores); not scaled by size."""


def transfer_rate(fit: Fit, s: Setting) -> float:
    """Bytes per second a link carries for Ray's object transfers: at their own efficiency once fitted."""
    return rate_bytes_per_s(s.link_mbit, fit.fitted(s.strategy).ps_efficiency or fit.efficiency)


def ps_placement(s: Setting) -> tuple[list[int], list[int]]:
    """Node of each worker and of each shard: one worker per node on the first W of `nodes`, the shards placed as
    raydist places them (placement.py: nodes without workers first)."""
    nodes = max(s.nodes, s.workers)
    workers = list(range(s.workers))
    shards = shard_nodes(s.options.servers, [str(i) for i in range(nodes)], [str(w) for w in workers])
    return workers, [int(n) for n in shards]


def ps_link_loads(grad_bytes: float, workers: list[int], shards: list[int]) -> dict[int, tuple[float, float]]:
    """Bytes into and out of each node's link per global step (one step of a worker picked uniformly: its push of
    G/S to every shard, then its fetch of G/S from every shard; traffic between a node and itself stays local).

    One shard on a node of its own, 4 workers: G in and G out per step, the fan-in. Two such nodes: G/2 each."""
    loads: dict[int, list[float]] = {}
    share = grad_bytes / len(shards)
    for w in workers:
        for node in shards:
            if node == w:
                continue
            for src, dst in ((w, node), (node, w)):  # push, then fetch
                loads.setdefault(src, [0.0, 0.0])[1] += share / len(workers)
                loads.setdefault(dst, [0.0, 0.0])[0] += share / len(workers)
    return {n: (i, o) for n, (i, o) in loads.items()}


def ps_worker_remote_bytes(grad_bytes: float, worker: int, shards: list[int]) -> float:
    """Bytes one worker's step sends and receives over its own link: pushes and fetches of the remote slices."""
    return 2 * grad_bytes * sum(1 for n in shards if n != worker) / len(shards)


def ps_worker_bound(fit: Fit, s: Setting) -> float:
    """Steps/s if no link were shared: each worker's base, then its push and fetch over its own link."""
    rate = transfer_rate(fit, s)
    workers, shards = ps_placement(s)
    hops = 2 * min(s.options.servers, s.workers)  # a push to and a fetch from each shard
    return sum(
        1 / (base_for(fit, s) + ps_worker_remote_bytes(s.grad_bytes, w, shards) / rate + hops * fit.latency_s)
        for w in workers
    )


def ps_link_bound(fit: Fit, s: Setting) -> float:
    """Steps/s the busiest link allows (the fan-in)."""
    workers, shards = ps_placement(s)
    loads = ps_link_loads(s.grad_bytes, workers, shards)
    busiest = max((max(io) for io in loads.values()), default=0.0)
    return transfer_rate(fit, s) / busiest if busiest else math.inf


def shards_needed(fit: Fit, s: Setting) -> int:
    """Fewest shards at which the links no longer bound the rate (the workers do)."""
    for shards in range(1, max(s.nodes, s.workers) + 1):
        probe = s.with_options(servers=shards)
        if ps_link_bound(fit, probe) >= ps_worker_bound(fit, probe):
            return shards
    return max(s.nodes, s.workers)


def fitted_base(fit: Fit, s: Setting, steps_per_s: float) -> float:
    """The base at which the workers' bound gives the measured rate; the bound falls as the base grows: bisect."""
    lo_b, hi_b = 1e-7, 100.0
    # Its transfer efficiency as fitted, no cost per shard: the base found holds the shards' cost.
    own = {s.strategy: AsyncPSFitted(ps_efficiency=fit.fitted(s.strategy).ps_efficiency)}
    for _ in range(100):
        mid = (lo_b + hi_b) / 2
        trial = Fit(fit.efficiency, {s.strategy: mid}, s.params, fit.latency_s, own)
        lo_b, hi_b = (mid, hi_b) if ps_worker_bound(trial, s) > steps_per_s else (lo_b, mid)
    return lo_b


class AsyncPSCost(CostTerms):
    fit_phase = 1  # after the others, as its base goes last into the fit's table
    options = AsyncPSOptions
    fitted = AsyncPSFitted

    def network_bytes(self, s: Setting) -> float:
        raise ValueError("the async PS has no collective byte count: its links are loaded by ps_link_loads")

    def hops(self, s: Setting) -> float:
        return 2 * min(s.options.servers, s.workers)  # a push to and a fetch from each shard

    def base(self, fit: Fit, s: Setting) -> float:
        return super().base(fit, s) + fit.fitted(s.strategy).per_shard_s * s.options.servers

    def step_s(self, fit: Fit, s: Setting) -> float:
        return 1.0 / self.steps_per_s(fit, s) * s.workers

    def steps_per_s(self, fit: Fit, s: Setting) -> float:
        """Every worker's steps added up, as its summaries count them."""
        return min(ps_worker_bound(fit, s), ps_link_bound(fit, s))

    def samples_per_step(self, s: Setting, batch_size: int) -> int:
        return batch_size

    def fitting_runs(self, runs: list[dict[str, Any]], low: float, top: float) -> list[dict[str, Any]]:
        # Its one-shard run at the lowest rate (for its transfer efficiency), its runs with the fewest and the most
        # shards at the highest (the base, and the cost per shard).
        chosen = [p for p in runs if p["link_mbit"] == low and (p.get("servers") or 1) == 1 and low < top][:1]
        at_top = [p for p in runs if p["link_mbit"] == top]
        if at_top:
            shards = [p.get("servers") or 1 for p in at_top]
            chosen += [at_top[shards.index(min(shards))]]
            chosen += [at_top[shards.index(max(shards))]] if max(shards) > min(shards) else []
        return chosen

    def fit_into(self, result: Fit, mine: list[dict[str, Any]], top: float) -> None:
        if not mine:
            return
        name = mine[0]["strategy"]
        slow = [p for p in mine if p["link_mbit"] < top]
        if slow:  # bound by its busiest link: the measured rate over the raw link's bound is the efficiency
            raw = Fit(1.0, {name: 0.0}, slow[0]["params"])
            result.set_fitted(
                name, ps_efficiency=min(1.0, slow[0]["steps_per_s"] / ps_link_bound(raw, setting_of(slow[0])))
            )
        # At the fastest link the links should not bound it, else its base cannot be seen.
        bases = {
            setting_of(p).options.servers: fitted_base(result, setting_of(p), p["steps_per_s"])
            for p in mine
            if p["link_mbit"] == top
        }
        if not bases:
            return
        few, most = min(bases), max(bases)  # a line through the fewest and the most shards: base + per_shard x S
        if most > few:
            result.set_fitted(name, per_shard_s=max(0.0, (bases[most] - bases[few]) / (most - few)))
        result.base_s[name] = max(bases[few] - result.fitted(name).per_shard_s * few, 1e-6)

    def label(self, p: dict[str, Any]) -> str:
        return f", {p['servers']} shard(s)" if p.get("servers") else ""

    def plan(self, fit: Fit, s: Setting) -> tuple[Setting, dict[str, Any]]:
        shards = shards_needed(fit, s.with_options(servers=1))
        return s.with_options(servers=shards), {"shards": shards}
