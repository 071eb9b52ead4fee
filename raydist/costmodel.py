"""A cost model of one training step for each strategy, fitted on measured runs: what `raydist plan` predicts with.

Time per step = a base time (compute, optimizer, the strategy's fixed per-step costs) + the bytes the strategy moves
over the busiest link / (efficiency x the link's rate) + a latency per message hop (assumed: the emulated links have
none to fit it on). docs/costmodel.md says what is fitted on which runs, and how well it predicts the others.

- sync DDP: ring all-reduce of the gradients, 2(n-1)/n x G each way per worker, every step.
- local SGD: sync's base; the same all-reduce of the parameters every H steps (ring averaging: G to one
  neighbour); and its checkpoints, in which every rank writes its own replica's state (sync writes one).
- FSDP: all-gather in forward and again in backward (reshard_after_forward) plus a reduce-scatter: 3(n-1)/n x G
  with NCCL; 4(n-1)/n x G with gloo, whose reduce-scatter moves an all-reduce's bytes.
- async PS: no step waits for another worker, so the cluster's rate in steps/s is the lower of what the workers
  can do (base, a cost per shard, their own pushes and fetches) and what the busiest link carries
  (`ps_link_bound`: the fan-in), at the efficiency Ray's object transfers get.

Everything here is pure: measured points in, fitted parameters and predictions out (tests/test_costmodel.py).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

STRATEGIES = ("sync", "local_sgd", "async", "fsdp")
BYTES_PER_PARAM = 4  # fp32 gradients and parameters on the wire


@dataclass(frozen=True)
class Setting:
    """What a step's cost depends on, besides the fitted parameters."""

    strategy: str
    workers: int
    params: int
    link_mbit: float
    servers: int = 1
    """async: parameter-server shards (async_ps.server_placement=spread)."""
    nodes: int = 0
    """Nodes of the cluster, one worker each on the first `workers`; 0 = as many as workers. async: the rest can
    hold server shards alone."""
    sync_every: int = 8
    """local SGD: steps between two averagings (H)."""
    averaging: str = "allreduce"
    """local SGD: allreduce, or ring (each worker sends its parameters to one neighbour)."""
    reshard_after_forward: bool = True
    """FSDP: gather the parameters again in backward (3 collectives of G per step instead of 2)."""
    backend: str = "gloo"
    """The collective library. FSDP's reduce-scatter: NCCL's moves (n-1)/n x G per rank; gloo's (torch 2.13) moves
    2(n-1)/n x G, an all-reduce's bytes (counted on loopback, 4 ranks: 6.0 x G in all, all-gather 3.0 x G)."""
    checkpoint_every: int = 0
    """local SGD: steps between two checkpoints (0: none). Its replicas differ, so every rank writes its own model
    and optimizer state, W copies where sync writes one; that extra cost is modelled. The others' checkpoints are
    in their fitted base (sync saves rank 0's copy, FSDP each rank's shard, async the driver's pull from the shards
    while workers go on)."""

    @property
    def grad_bytes(self) -> float:
        return self.params * BYTES_PER_PARAM


@dataclass
class Fit:
    """The fitted parameters: one link efficiency, one base time per strategy (seconds per step per worker), and the
    base's model size (a prediction for another model size scales it linearly: compute grows with parameters)."""

    efficiency: float
    base_s: dict[str, float]
    base_params: int
    latency_s: float = 50e-6
    """Per message hop (alpha). Assumed, not fitted: a switch hop plus the TCP stack on small clusters."""
    ps_efficiency: float = 0.0
    """async: the share of a link Ray's object transfers get (fitted on the one-shard run at the slowest link, which
    the busiest link bounds); 0 = `efficiency`."""
    checkpoint_s: float = 0.0
    """local SGD: seconds per checkpoint at `base_params` (every rank writing its replica's state, rank 0 hashing
    them all, Ray copying them to storage); scaled by parameter count like the base. No network term: the
    replicas go to storage, not to other workers (on the emulated cluster storage is a local disk)."""
    per_shard_s: float = 0.0
    """async: what each server shard adds to a worker's step besides its bytes (a push and a fetch call: Ray's cost
    per call, and on the emulated cluster the shard's process competing for the same cores); not scaled by size."""
    fitted_on: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ring_allreduce_bytes(nbytes: float, n: int) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce of `nbytes`: reduce-scatter then all-gather."""
    return 2 * (n - 1) / n * nbytes if n > 1 else 0.0


def ps_placement(s: "Setting") -> tuple[list[int], list[int]]:
    """Node of each worker and of each shard: one worker per node on the first W of `nodes`, the shards placed as
    raydist places them (raydist.strategies.async_ps.placement: nodes without workers first)."""
    from raydist.strategies.async_ps.placement import shard_nodes

    nodes = max(s.nodes, s.workers)
    workers = list(range(s.workers))
    shards = shard_nodes(s.servers, [str(i) for i in range(nodes)], [str(w) for w in workers])
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


def network_bytes(s: Setting) -> float:
    """Bytes per step per worker on the worker's own link, each way, for the collective strategies."""
    g, n = s.grad_bytes, s.workers
    if s.strategy == "sync":
        return ring_allreduce_bytes(g, n)
    if s.strategy == "local_sgd":
        per_sync = (g if n > 1 else 0.0) if s.averaging == "ring" else ring_allreduce_bytes(g, n)
        return per_sync / s.sync_every
    if s.strategy == "fsdp":
        gathers, scatter = (2 if s.reshard_after_forward else 1), (2 if s.backend == "gloo" else 1)
        return (gathers + scatter) * (n - 1) / n * g if n > 1 else 0.0
    raise ValueError(f"no collective byte count for {s.strategy}")


def hops(s: Setting) -> float:
    """Message hops per step that each pay the latency: 2(n-1) per ring all-reduce."""
    n = s.workers
    if s.strategy == "sync":
        return 2 * (n - 1)
    if s.strategy == "local_sgd":
        return (1 if s.averaging == "ring" else 2 * (n - 1)) / s.sync_every
    if s.strategy == "fsdp":
        return 3 * (n - 1)
    return 2 * min(s.servers, n)  # async: a push to and a fetch from each shard


def rate_bytes_per_s(link_mbit: float, efficiency: float) -> float:
    return link_mbit * 1e6 / 8 * efficiency


def base_for(fit: Fit, s: Setting) -> float:
    if s.strategy not in fit.base_s:
        raise KeyError(f"no fitted base time for {s.strategy}")
    base = fit.base_s[s.strategy] * s.params / fit.base_params
    return base + fit.per_shard_s * s.servers if s.strategy == "async" else base


def step_s(fit: Fit, s: Setting) -> float:
    """Predicted seconds per step per worker: the time between one worker's steps."""
    if s.strategy == "async":
        return 1.0 / steps_per_s(fit, s) * s.workers
    return (base_for(fit, s) + network_bytes(s) / rate_bytes_per_s(s.link_mbit, fit.efficiency)
            + hops(s) * fit.latency_s + checkpoint_s(fit, s) / (s.checkpoint_every or 1))


def checkpoint_s(fit: Fit, s: Setting) -> float:
    """Seconds one checkpoint of local SGD costs (the others' are in their base)."""
    if s.strategy != "local_sgd" or not s.checkpoint_every:
        return 0.0
    return fit.checkpoint_s * s.params / fit.base_params


def steps_per_s(fit: Fit, s: Setting) -> float:
    """Predicted steps per second as the summaries count them: synchronous steps for sync, local SGD and FSDP (all
    workers together), every worker's steps added up for async."""
    if s.strategy != "async":
        return 1.0 / step_s(fit, s)
    return min(ps_worker_bound(fit, s), ps_link_bound(fit, s))


def ps_worker_bound(fit: Fit, s: Setting) -> float:
    """async steps/s if no link were shared: each worker's base, then its push and fetch over its own link."""
    rate = rate_bytes_per_s(s.link_mbit, fit.ps_efficiency or fit.efficiency)
    workers, shards = ps_placement(s)
    return sum(1 / (base_for(fit, s) + ps_worker_remote_bytes(s.grad_bytes, w, shards) / rate
                    + hops(s) * fit.latency_s) for w in workers)


def ps_link_bound(fit: Fit, s: Setting) -> float:
    """async steps/s the busiest link allows (the fan-in)."""
    workers, shards = ps_placement(s)
    loads = ps_link_loads(s.grad_bytes, workers, shards)
    busiest = max((max(io) for io in loads.values()), default=0.0)
    return rate_bytes_per_s(s.link_mbit, fit.ps_efficiency or fit.efficiency) / busiest if busiest else math.inf


def samples_per_s(fit: Fit, s: Setting, batch_size: int) -> float:
    per_step = batch_size * (1 if s.strategy == "async" else s.workers)
    return steps_per_s(fit, s) * per_step


def shards_needed(fit: Fit, s: Setting) -> int:
    """Fewest shards at which the links no longer bound the async rate (the workers do)."""
    for shards in range(1, max(s.nodes, s.workers) + 1):
        probe = replace(s, servers=shards)
        if ps_link_bound(fit, probe) >= ps_worker_bound(fit, probe):
            return shards
    return max(s.nodes, s.workers)


# ---- fitting and validation on measured points ----------------------------------------------------------------

def setting_of(point: dict[str, Any]) -> Setting:
    """A measured run (benchmarks/shaped_strategies.py's JSON) as a Setting."""
    return Setting(strategy=point["strategy"], workers=point["workers"], params=point["params"],
                   link_mbit=point["link_mbit"], servers=point.get("servers") or 1,
                   sync_every=point.get("sync_every", 8), nodes=point.get("nodes", 0),
                   averaging=point.get("averaging", "allreduce"),
                   checkpoint_every=point.get("checkpoint_every", 0))


def usable(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs without a straggler (the model has no straggler term) and with a measured rate, the repeats of one
    setting merged: their mean steps/s, with `runs` and `spread` (the lowest and highest) of what was merged."""
    groups: dict[Setting, list[dict[str, Any]]] = {}
    for p in points:
        if not p.get("straggler") and p.get("steps_per_s"):
            groups.setdefault(setting_of(p), []).append(p)
    merged = []
    for same in groups.values():
        rates = [p["steps_per_s"] for p in same]
        merged.append({**same[0], "steps_per_s": statistics.fmean(rates), "runs": len(rates),
                       "spread": (min(rates), max(rates))})
    return merged


def fit(points: list[dict[str, Any]], latency_s: float = 50e-6) -> Fit:
    """Efficiency from sync DDP at the lowest and highest link rate (two equations: base + bytes / (eff x rate)),
    then each strategy's base from its run at the highest rate, with the network term taken out (async: there the
    links must not bound it, else its base cannot be seen). Reads only the runs `fitting_side` picks; the rest are
    for `validate`."""
    chosen = fitting_side(points)
    sync = sorted((p for p in chosen if p["strategy"] == "sync"), key=lambda p: p["link_mbit"])
    if len(sync) < 2 or sync[0]["link_mbit"] == sync[-1]["link_mbit"]:
        raise ValueError("fitting needs sync runs at two link rates")
    lo, hi = sync[0], sync[-1]
    # t = base + V / (eff x rate) + hops x alpha at both rates: the difference gives eff.
    v = network_bytes(setting_of(lo))
    delta = 1 / lo["steps_per_s"] - 1 / hi["steps_per_s"]
    denom = v / (lo["link_mbit"] * 1e6 / 8) - v / (hi["link_mbit"] * 1e6 / 8)
    efficiency = min(1.0, denom / delta) if delta > 0 else 1.0
    result = Fit(efficiency, {}, hi["params"], latency_s, fitted_on=[label(p) for p in chosen])
    top = hi["link_mbit"]
    slow_ps = [p for p in chosen if p["strategy"] == "async" and p["link_mbit"] < top]
    if slow_ps:  # bound by its busiest link: the measured rate over the raw link's bound is the efficiency
        raw = Fit(1.0, {"async": 0.0}, slow_ps[0]["params"])
        result.ps_efficiency = min(1.0, slow_ps[0]["steps_per_s"] / ps_link_bound(raw, setting_of(slow_ps[0])))
    async_bases: dict[int, float] = {}
    for p in chosen:
        st = setting_of(p)
        if p["link_mbit"] != top:
            continue
        if st.strategy == "async":
            # The base at which the workers' bound gives the measured rate (at the fastest link the links should
            # not bound it); the bound falls as the base grows: bisect.
            lo_b, hi_b = 1e-7, 100.0
            for _ in range(100):
                mid = (lo_b + hi_b) / 2
                trial = Fit(efficiency, {"async": mid}, st.params, latency_s, result.ps_efficiency)
                lo_b, hi_b = (mid, hi_b) if ps_worker_bound(trial, st) > p["steps_per_s"] else (lo_b, mid)
            async_bases[st.servers] = lo_b
        elif st.strategy != "local_sgd":
            probe = Fit(efficiency, {st.strategy: 0.0}, st.params, latency_s)
            result.base_s[st.strategy] = max(1 / p["steps_per_s"] - step_s(probe, st), 1e-6)
    local = [p for p in chosen if p["strategy"] == "local_sgd"]
    if local and "sync" in result.base_s:
        # Local SGD computes what sync computes: sync's base. What its checkpointed runs take beyond base and
        # averaging is the replicas' checkpoints, which the links do not carry: the mean over its runs.
        result.base_s["local_sgd"] = result.base_s["sync"]
        probe = Fit(efficiency, dict(result.base_s), result.base_params, latency_s)
        per_ckpt = [(1 / p["steps_per_s"] - step_s(probe, replace(setting_of(p), checkpoint_every=0)))
                    * setting_of(p).checkpoint_every * result.base_params / p["params"] for p in local]
        result.checkpoint_s = max(0.0, statistics.fmean(per_ckpt))
    if async_bases:
        # A line through the fewest and the most shards: base + per_shard x S.
        few, most = min(async_bases), max(async_bases)
        if most > few:
            result.per_shard_s = max(0.0, (async_bases[most] - async_bases[few]) / (most - few))
        result.base_s["async"] = max(async_bases[few] - result.per_shard_s * few, 1e-6)
    return result


def label(p: dict[str, Any]) -> str:
    extra = f", {p['servers']} shard(s)" if p["strategy"] == "async" and p.get("servers") else ""
    if p["strategy"] == "local_sgd":
        extra = (", ring" if p.get("averaging") == "ring" else "") + (
            ", a checkpoint every epoch" if p.get("checkpoint_every") else ", no checkpoint but the last")
    return f"{p['strategy']}, {p['params'] / 1e6:.2g}M params @ {p['link_mbit']:g} Mbit/s{extra}"


def fitting_side(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs the fit reads, all of the most common model size: sync at every rate, every other strategy at the
    highest rate only (async: its runs with the fewest and the most shards there, and its one-shard run at the
    lowest rate, for its transfer efficiency). The rest is for validation."""
    runs = usable(points)
    if not runs:
        return []
    sizes = [p["params"] for p in runs]
    size = max(sorted(set(sizes)), key=sizes.count)  # the most common model size; the others are held out
    runs = [p for p in runs if p["params"] == size]
    top = max(p["link_mbit"] for p in runs)
    chosen = []
    for link in sorted({p["link_mbit"] for p in runs}):
        chosen += [p for p in runs if p["strategy"] == "sync" and p["link_mbit"] == link][:1]
    low = min(p["link_mbit"] for p in runs)
    chosen += [p for p in runs if p["strategy"] == "async" and p["link_mbit"] == low and (p.get("servers") or 1) == 1
               and low < top][:1]
    # Local SGD with checkpoints at the lowest and the highest rate: its checkpoints' cost (its base is sync's).
    checkpointed = [p for p in runs if p["strategy"] == "local_sgd" and p.get("checkpoint_every")
                    and p.get("averaging", "allreduce") == "allreduce"]
    for link in sorted({low, top}):
        chosen += [p for p in checkpointed if p["link_mbit"] == link][:1]
    for strategy in ("async", "fsdp"):
        at_top = [p for p in runs if p["strategy"] == strategy and p["link_mbit"] == top]
        if strategy == "async" and at_top:
            shards = [p.get("servers") or 1 for p in at_top]
            chosen += [at_top[shards.index(min(shards))]]
            at_top = [at_top[shards.index(max(shards))]] if max(shards) > min(shards) else []
        chosen += at_top[:1]
    return chosen


def same_setting(p: dict[str, Any], q: dict[str, Any]) -> bool:
    return setting_of(p) == setting_of(q)


@dataclass
class Check:
    point: str
    measured: float
    """The mean of the setting's runs."""
    predicted: float
    runs: int = 1
    spread: tuple[float, float] = (0.0, 0.0)

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def validate(points: list[dict[str, Any]], latency_s: float = 50e-6) -> tuple[Fit, list[Check]]:
    """Fit on `fitting_side`, predict steps/s of the other runs."""
    f = fit(points, latency_s)
    fitted = fitting_side(points)
    # Held out: every run whose setting differs from all fitted ones (a repeat of a fitted setting checks
    # reproducibility, not the model).
    checks = [Check(label(p), p["steps_per_s"], steps_per_s(f, setting_of(p)), p["runs"], p["spread"])
              for p in usable(points) if p["strategy"] in f.base_s and not any(same_setting(p, q) for q in fitted)]
    return f, checks


def validation_table(checks: list[Check]) -> str:
    rows = ["| run (held out) | runs | measured steps/s: mean (min-max) | predicted | error |", "|---|---|---|---|---|"]
    rows += [f"| {c.point} | {c.runs} | {c.measured:.1f} ({c.spread[0]:.1f}-{c.spread[1]:.1f}) | {c.predicted:.1f} | "
             f"{100 * c.error:+.0f}% |" for c in checks]
    return "\n".join(rows)
