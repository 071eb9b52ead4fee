"""Every training strategy raydist runs, one entry each: the one list that the jobs, the config, compare,
preflight, the summary and the cost model ask about a strategy. None of them names one.

An entry names its parts by import path ("module:attribute") so that reading the list imports neither torch nor
Ray; each part lives in the strategy's folder, raydist/strategies/<folder>/. Adding a strategy: its folder, one
`StrategySpec` below and one jobs/<name>.py (docs/dev/layout.md lists exactly what a new strategy touches).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE_DIR = Path(__file__).parent
RAY_TRAIN_DRIVER = "raydist.engines.raytrain:fit_on_ray_train"
LAUNCH_DRIVER = "raydist.engines.processes:fit_as_processes"
"""The driver of every loop strategy under `scaling.engine=launch` (one plain process per worker)."""


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
    driver: str = RAY_TRAIN_DRIVER
    """"module:function" taking (cfg, spec, session) and returning a `JobSummary`."""
    check: str = "raydist.driver.preflight:check_loop"
    """"module:function" taking (cfg): what only this job can check before Ray starts (raises a UsageError,
    writes nothing); run by `raydist.driver.preflight.check_before_ray` after the checks every job shares."""
    compared: bool = True
    """Whether `compare` runs it by default (any strategy can still be named in `compare.strategies`)."""
    section: str = ""
    """Its config section's key (`local_sgd` for `local_sgd.sync_every`); '' when it has none."""
    config: str = ""
    """"module:Class" of that section's dataclass, declared with `raydist.typedconfig.opt`; '' when none."""
    summary_fields: str = ""
    """"module:Class" of a dataclass of the summary fields only it fills (appended to `JobSummary`); '' when none."""
    cost: str = ""
    """"module:Class" of its `raydist.planning.costmodel.CostTerms`: the bytes and hops of its step, the options and
    fitted parameters of its own, and what is fitted on its measured runs; '' when `raydist plan` does not model it."""

    metrics: str = ""
    """"module:attribute" of a tuple of `raydist.observability.metric.Metric`: what it exports besides the common
    metrics (its `raydist top` columns and TensorBoard scalars among them); '' when none."""

    torch_config: str = ""
    """"module:function" taking (cfg) and returning Ray Train's torch backend config for its workers; '' for the
    plain `TorchConfig` (one process group over every worker)."""

    fallback: str = ""
    """The entry its job runs as, after one line saying why, where `unfit` finds this one cannot run (a missing
    library, a setting it does not support); '' when it has none."""
    unfit: str = ""
    """"module:function" taking (cfg) and returning why it cannot run here (then `fallback` runs), or None."""

    quiet_signs: tuple[str, ...] = ()
    """What a surviving worker's "Error in training function" traceback says when this strategy's own machinery is
    torn down around it after a peer died (heal: torchft's lighthouse gone): kept off the console, in the log files,
    as the collectives' own signs of a lost peer are (raydist.observability.console), since the driver says in one
    line what happens next."""

    defaults_file: str = ""
    """A YAML under raydist/ holding only the keys where its job's defaults differ from the dataclass defaults
    (its tuned optimizer, say); '' when none differ."""

    @property
    def runs_as_processes(self) -> bool:
        """Whether `scaling.engine=launch` can run it: a loop strategy on the shared driver whose workers need one
        plain process group (no backend of their own, such as heal's replica groups, and no actors of its own)."""
        return bool(self.worker) and not self.torch_config and self.driver == RAY_TRAIN_DRIVER

    def driver_for(self, engine: str) -> str:
        """The "module:function" that runs it with `scaling.engine`: its own driver, or the launch engine's."""
        return LAUNCH_DRIVER if engine == "launch" and self.runs_as_processes else self.driver

    @property
    def defaults(self) -> Path | None:
        return PACKAGE_DIR / self.defaults_file if self.defaults_file else None

    def load(self, what: str) -> Any:
        return load_path(getattr(self, what))

    def load_driver(self, engine: str) -> Any:
        return load_path(self.driver_for(engine))


def load_path(path: str) -> Any:
    """The object a "module:attribute" path names."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


STRATEGIES: dict[str, StrategySpec] = {
    s.name: s
    for s in (
        StrategySpec(
            "sync",
            "sync DDP",
            "synchronous data parallel (PyTorch DDP), gradients all-reduced every step",
            worker="raydist.strategies.sync.worker:SyncDDP",
            cost="raydist.strategies.sync.cost:SyncCost",
        ),
        StrategySpec(
            "local_sgd",
            "local SGD",
            "workers step alone and average parameters every H steps (all-reduce or ring Polyak)",
            worker="raydist.strategies.local_sgd.worker:LocalSGD",
            section="local_sgd",
            config="raydist.strategies.local_sgd.config:LocalSGDConfig",
            cost="raydist.strategies.local_sgd.cost:LocalSGDCost",
        ),
        StrategySpec(
            "async",
            "async PS",
            "Downpour SGD: workers push gradients to parameter-server actors without waiting",
            driver="raydist.strategies.async_ps.driver:run",
            check="raydist.strategies.async_ps.checks:check_async",
            section="async_ps",
            config="raydist.strategies.async_ps.config:AsyncPSConfig",
            summary_fields="raydist.strategies.async_ps.summary:ServerBooks",
            cost="raydist.strategies.async_ps.cost:AsyncPSCost",
            metrics="raydist.strategies.async_ps.metrics:METRICS",
            defaults_file="strategies/async_ps/defaults.yaml",
        ),
        StrategySpec(
            "fsdp",
            "FSDP",
            "fully sharded data parallel (FSDP2): each worker holds 1/W of the parameters, "
            "gradients and optimizer state; sharded checkpoints",
            worker="raydist.strategies.fsdp.worker:FSDP",
            compared=False,
            section="fsdp",
            config="raydist.strategies.fsdp.config:FSDPConfig",
            cost="raydist.strategies.fsdp.cost:FSDPCost",
        ),
        StrategySpec(
            "heal",
            "heal (torchft)",
            "sync DDP that heals in place: a failed worker is replaced while the "
            "others keep training, and takes the state from a live peer (torchft)",
            worker="raydist.strategies.heal.worker:Heal",
            check="raydist.strategies.heal.checks:check_heal",
            compared=False,
            section="heal",
            config="raydist.strategies.heal.config:HealConfig",
            summary_fields="raydist.strategies.heal.summary:HealBooks",
            torch_config="raydist.strategies.heal.backend:torchft_config",
            fallback="sync",
            unfit="raydist.strategies.heal.checks:why_not_heal",
            quiet_signs=(
                "Failed to connect to lighthouse",
                "lighthouse quorum failed",
                "Failed to send heartbeat to lighthouse",
            ),
        ),
    )
}

# Jobs that are not strategies but share the config and the launcher.
OTHER_JOBS: dict[str, StrategySpec] = {
    "compare": StrategySpec(
        "compare",
        "compare",
        "run several strategies on one setting and set them side by side",
        driver="raydist.compare.runner:run",
        check="raydist.compare.checks:check_compare",
        section="compare",
        config="raydist.compare.config:CompareConfig",
    ),
    "tune": StrategySpec(
        "tune",
        "tune",
        "sweep one strategy's settings with Ray Tune, each trial a run of its job",
        driver="raydist.sweeps.runner:run",
        check="raydist.sweeps.checks:check_tune",
        section="tune",
        config="raydist.sweeps.config:TuneConfig",
    ),
}


def runnable(name: str, cfg: Any) -> tuple[str, str | None]:
    """The entry to run for `name` on `cfg`: itself, or its fallback with the reason (`StrategySpec.unfit`)."""
    spec = get(name)
    why = spec.load("unfit")(cfg) if spec.unfit else None
    return (spec.fallback, why) if why and spec.fallback else (name, None)


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


def all_specs() -> list[StrategySpec]:
    """Every entry, strategies first, in the order the config reference and the summary list their parts."""
    return [*STRATEGIES.values(), *OTHER_JOBS.values()]


def modelled() -> list[StrategySpec]:
    """The strategies the cost model has terms for, in registry order."""
    return [spec for spec in STRATEGIES.values() if spec.cost]
