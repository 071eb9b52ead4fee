"""The async PS's config section (`async_ps.*`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raydist.typedconfig import opt


@dataclass
class AsyncPSConfig:
    """jobs/async.py: Downpour SGD against parameter-server actors."""

    num_servers: int = opt(
        1, "parameter-server actors; the flat parameter vector is split into this many contiguous slices", ge=1
    )
    n_fetch: int = opt(
        1,
        "a worker fetches fresh parameters every this many of its steps (in between it applies its own gradients locally)",
        ge=1,
    )
    max_staleness: int = opt(
        -1, "bound on an update's staleness (server versions); -1 = unbounded", ge=0, special={-1: "unbounded"}
    )
    on_stale: Literal["wait", "drop"] = opt(
        "wait",
        "with a bound: wait = a worker waits before a step that could exceed it; drop = the server discards gradients past it",
    )
    staleness_lr: bool = opt(False, "divide the learning rate of each update by max(1, its staleness)")
    cpus_per_server: float = opt(
        0.0, "Ray CPUs reserved per server actor; 0 = none (a server mostly waits for messages)", ge=0
    )
    server_placement: Literal["spread", "default"] = opt(
        "spread",
        "spread = one server shard per node as far as the nodes go, nodes without workers first, so that "
        "the workers' pushes fan in over several links, not one (docs/benchmarks.md); with cpus_per_server > 0, Ray's "
        "SPREAD over nodes with free CPUs; default = Ray's own choice, which may pack actors that reserve no CPU onto "
        "one node",
    )
