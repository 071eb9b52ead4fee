"""Every training strategy raydist runs, one entry each: the one list the jobs, the config and `compare` read.

An entry names its code by import path ("module:attribute") so that reading the list imports neither torch nor
Ray: `raydist.config` validates `compare.strategies` against it before anything starts.

Adding a strategy: write its module (a `Strategy` subclass for the shared Ray Train loop, or a driver of its own
like the async PS, with a `check` for what it refuses), add one `StrategySpec` below, and, if its defaults differ
from the dataclass defaults, a `raydist/configs/<name>.yaml` holding only the keys that differ. See
docs/strategies.md.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).parent / "configs"


@dataclass(frozen=True)
class StrategySpec:
    name: str
    """What users type: `compare.strategies`, `python -m raydist.job <name>`, jobs/<name>.py."""
    label: str
    """How tables and plots name it."""
    summary: str
    """One line for `--help` and the docs."""
    worker: str = ""
    """"module:Class" of a `raydist.train.Strategy` run by the shared loop on Ray Train workers; '' when `driver` does it all."""
    driver: str = "raydist.raytrain:fit_on_ray_train"
    """"module:function" taking (cfg, spec, session) and returning a `JobSummary`."""
    check: str = "raydist.preflight:check_loop"
    """"module:function" taking (cfg): what only this job can check before Ray starts (raises a UsageError,
    writes nothing); run by `raydist.preflight.check_before_ray` after the checks every job shares."""
    compared: bool = True
    """Whether `compare` runs it by default (any strategy can still be named in `compare.strategies`)."""

    @property
    def defaults(self) -> Path | None:
        """raydist/configs/<name>.yaml: the keys whose job defaults differ from the dataclass defaults, if any."""
        path = CONFIG_DIR / f"{self.name}.yaml"
        return path if path.is_file() else None

    def load(self, what: str) -> Any:
        module, _, attribute = getattr(self, what).partition(":")
        return getattr(importlib.import_module(module), attribute)


STRATEGIES: dict[str, StrategySpec] = {
    s.name: s
    for s in (
        StrategySpec("sync", "sync DDP", "synchronous data parallel (PyTorch DDP), gradients all-reduced every step",
                     worker="raydist.strategies.sync.worker:SyncDDP"),
        StrategySpec("local_sgd", "local SGD",
                     "workers step alone and average parameters every H steps (all-reduce or ring Polyak)",
                     worker="raydist.strategies.local_sgd.worker:LocalSGD"),
        StrategySpec("async", "async PS", "Downpour SGD: workers push gradients to parameter-server actors without waiting",
                     driver="raydist.strategies.async_ps.driver:run", check="raydist.strategies.async_ps.checks:check_async"),
        StrategySpec("fsdp", "FSDP", "fully sharded data parallel (FSDP2): each worker holds 1/W of the parameters, "
                     "gradients and optimizer state; sharded checkpoints", worker="raydist.strategies.fsdp.worker:FSDP",
                     compared=False),
    )
}

# Jobs that are not strategies but share the config and the launcher.
OTHER_JOBS: dict[str, StrategySpec] = {
    "compare": StrategySpec("compare", "compare", "run several strategies on one setting and set them side by side",
                            driver="raydist.compare:run", check="raydist.preflight:check_compare"),
}


def get(name: str) -> StrategySpec:
    """A strategy's or another job's entry."""
    return STRATEGIES.get(name) or OTHER_JOBS[name]


def names() -> list[str]:
    return list(STRATEGIES)


def compared() -> list[str]:
    """The strategies `compare` runs unless `compare.strategies` names others."""
    return [name for name, spec in STRATEGIES.items() if spec.compared]


def jobs() -> list[str]:
    return names() + list(OTHER_JOBS)
