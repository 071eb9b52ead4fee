"""The async PS's own summary fields: the parameter server's books (null in other strategies' summaries)."""

from __future__ import annotations

from dataclasses import dataclass

from raydist.summary_fields import described


@dataclass
class ServerBooks:
    servers: int | None = described("async: parameter-server shards", None)
    server_hosts: list[str] | None = described("async: the host of each server shard (async_ps.server_placement)", None)
    staleness_mean: float | None = described(
        "async: mean staleness (server versions) of the applied updates", None, compare="staleness mean"
    )
    staleness_max: int | None = described(
        "async: largest staleness of an applied update", None, compare="staleness max"
    )
    dropped: int | None = described("async: gradients discarded as too stale (async_ps.on_stale=drop)", None)
    steps_per_worker: list[int] | None = described("async: steps each worker computed this session", None)
