"""The config a strategy's job gets when another job runs it (compare runs each strategy, tune each trial): the
strategy's own defaults, with the sections the other job shares with it on top."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raydist import registry
from raydist.config import COMMON_SECTIONS, Config, job_defaults
from raydist.typedconfig import apply, merge, validate

# What every strategy's job takes from the running job's config: the common sections but optim and schedule, which
# stay each job's own (its tuned defaults: `StrategySpec.defaults_file`), and run (each job gets its own directory);
# and every strategy's own section.
SHARED_SECTIONS = (
    *(s for s in COMMON_SECTIONS if s not in ("optim", "schedule", "run")),
    *(spec.section for spec in registry.STRATEGIES.values() if spec.section),
)


def shared_config(cfg: Config) -> dict[str, Any]:
    everything = cfg.to_dict()
    shared = {k: everything[k] for k in SHARED_SECTIONS}
    if cfg.run.address:
        shared["run"] = {"address": cfg.run.address}
    if not cfg.run.tensorboard:  # the only other run key each strategy's job takes from the command line
        shared.setdefault("run", {})["tensorboard"] = False
    return shared


def strategy_config(cfg: Config, strategy: str, runs_dir: Path) -> Config:
    """The config `strategy`'s job gets: its own defaults, the shared sections, its run directory (so that its checks
    run in the running job, before the first child job starts)."""
    own = merge(Config(), [p] if (p := job_defaults(strategy)) else [])
    shared = shared_config(cfg)
    apply(own, {**shared, "run": {**shared.get("run", {}), "storage_path": str(runs_dir), "name": strategy}})
    return validate(own)
