"""How a metric raydist exports is declared: the common ones in raydist.observability.ray_metrics, a strategy's own
in its folder (named by `StrategySpec.metrics`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # "gauge" or "counter"
    description: str
    extra_tags: tuple[str, ...] = ()
    """A tag besides raydist's own; `worker`: a value per worker, set by another process (a server shard), which
    `raydist top` shows on that worker's row."""
    top: str = ""
    """The header of its column in `raydist top`'s table; '' for none (the common columns are top's own)."""
    per_step: bool = False
    """Whether a step's record carries it, written to TensorBoard as `train/<name>`."""
