"""The async PS's own metrics (raydist.observability.ray_metrics exports them with the common ones)."""

from __future__ import annotations

from raydist.observability.metric import Metric

METRICS = (
    Metric(
        "staleness",
        "gauge",
        "async PS: updates applied between a worker's fetch and its gradient's arrival (latest, per worker)",
        ("worker",),
        top="STALENESS",
        per_step=True,
    ),
    Metric(
        "ps_updates_per_s", "gauge", "async PS: updates a server shard applied per second since the previous export"
    ),
)
