"""compare.tune: before the comparison, each strategy's settings are swept by jobs/tune.py's job with the same space,
trials and scheduler for every strategy (the `tune` section; by default the learning rate), so that each strategy is
compared at its own best rather than at one setting for all."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raydist.compare.childjob import run_job
from raydist.compare.report import label
from raydist.config import Config
from raydist.errors import RaydistError
from raydist.jobconfig import shared_config
from raydist.summary import SUMMARY_FILE
from raydist.typedconfig import apply, validate

DEFAULT_SPACE = {"optim.lr": "loguniform(3e-4, 3e-1)"}
"""What compare sweeps when tune.space is empty: the peak learning rate over three decades, which holds every
job's default (AdamW's 0.003, the async PS's Adagrad at 0.05)."""
SWEEP_MARK = "[tune] "


@dataclass
class Swept:
    """One strategy's sweep: its best settings (a config file its job takes) and the sweep's summary.json."""

    strategy: str
    best_config: Path
    best_values: dict[str, Any]
    summary: dict[str, Any]


def sweeps_dir(out: Path) -> Path:
    return out / "sweeps"


def space(cfg: Config) -> dict[str, Any]:
    return dict(cfg.tune.space) or dict(DEFAULT_SPACE)


def sweep_settings(cfg: Config, strategy: str, out: Path) -> dict[str, Any]:
    """The whole config of `strategy`'s sweep: compare's shared sections and its tune section, in its own run dir."""
    shared = shared_config(cfg)
    tune = {**cfg.to_dict()["tune"], "space": space(cfg), "strategy": strategy}
    run = {**shared.get("run", {}), "storage_path": str(sweeps_dir(out)), "name": strategy}
    return {**shared, "tune": tune, "run": run}


def sweep_config(cfg: Config, strategy: str, out: Path) -> Config:
    """`sweep_settings` as the tune job reads them, for its checks before anything starts."""
    swept = Config()
    apply(swept, sweep_settings(cfg, strategy, out))
    return validate(swept)


def describe(cfg: Config) -> str:
    keys = ", ".join(f"{k} {v}" for k, v in space(cfg).items())
    return f"{keys}; {cfg.tune.num_samples} trial(s) each, {cfg.tune.scheduler}, by {cfg.tune.metric}"


def sweep(cfg: Config, strategy: str, out: Path, index: str) -> Swept:
    """Run `strategy`'s sweep (a fresh one: a rerun of compare sweeps again) and read its best settings."""
    settings = sweep_settings(cfg, strategy, out)
    run = {k: v for k, v in settings.pop("run").items() if k not in ("storage_path", "name")}
    if run:  # run.address, run.tensorboard; the run directory comes from run_job's --set
        settings["run"] = run
    config = sweeps_dir(out) / f"{strategy}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(settings, sort_keys=False))
    print(f"[compare] {index} sweeping {label(strategy)}", flush=True)
    run_dir = run_job("tune", [config], sweeps_dir(out), strategy, (SWEEP_MARK,))
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    if not summary.get("best_config"):
        raise RaydistError(
            f"{strategy}: its sweep found no best trial ({summary.get('errored', 0)} of {summary.get('trials', 0)} "
            f"errored): see {summary.get('table')}"
        )
    print(
        f"[compare] {index} {label(strategy)}: best {summary['best_values']} ({cfg.tune.metric} "
        f"{summary['best_metric']:.4f}; {summary['stopped_early']} of {summary['trials']} stopped early)",
        flush=True,
    )
    return Swept(strategy, Path(summary["best_config"]), dict(summary["best_values"]), summary)
