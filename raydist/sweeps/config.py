"""The tune job's config section (`tune.*`): which strategy each trial runs, the space it searches, and how."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from raydist import registry
from raydist.typedconfig import check, free, opt

METRICS = {"test_accuracy": "max", "test_loss": "min", "loss": "min"}
"""What every strategy reports at each evaluation, and which way is better."""


def strategy_name(value: str, key: str) -> str:
    known = registry.names()
    check(value in known, key, f"unknown strategy {value!r} (choose from {', '.join(known)})")
    return value


def metric_name(value: str, key: str) -> str:
    check(value in METRICS, key, f"must be a metric every strategy reports: {', '.join(METRICS)} (got {value!r})")
    return value


def flat_space(value: Any, key: str) -> dict[str, Any]:
    """`optim.lr: ...` as YAML writes it, or {'optim': {'lr': ...}} as `--set tune.space.optim.lr=...` does."""
    check(isinstance(value, dict), key, f"must be a mapping of config keys to distributions (got {value!r})")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in flat_space(v, f"{key}.{k}").items()})
        else:
            out[str(k)] = v
    return out


@dataclass
class TuneConfig:
    """jobs/tune.py: a sweep of one strategy's settings with Ray Tune, each trial a run of that strategy's job."""

    strategy: str = opt(
        registry.names()[0], "the strategy every trial runs (its job, with the trial's values)", parse=strategy_name
    )
    space: dict = free(
        "config key -> distribution: uniform(low, high), loguniform(low, high), randint(low, high), "
        "choice([a, b]), grid([a, b]); e.g. optim.lr: loguniform(1e-4, 1e-1) (docs/tune.md)",
        parse=flat_space,
    )
    num_samples: int = opt(8, "trials to draw from the space (a grid's points each this many times)", ge=1)
    metric: str = opt("test_accuracy", f"what the trials are ranked by: {', '.join(METRICS)}", parse=metric_name)
    scheduler: Literal["asha", "fifo"] = opt(
        "asha", "asha: stop trials that trail at each evaluation (Ray Tune's ASHA); fifo: run every trial to the end"
    )
    grace_evaluations: int = opt(1, "ASHA: evaluations every trial gets before it may be stopped", ge=1)
    reduction_factor: int = opt(2, "ASHA: at each rung, about 1 trial in this many goes on", ge=2)
    max_concurrent: int = opt(
        0,
        "trials running at once; 0 = as many as the cluster's CPUs hold (scaling.num_workers x "
        "scaling.cpus_per_worker each)",
        ge=0,
    )
    seed: int = opt(0, "the search's random seed: the same seed draws the same trials", ge=0)

    @property
    def mode(self) -> str:
        return METRICS[self.metric]
