"""jobs/compare.py's work: run each strategy's job on one shared setting, then write results.json, results.md and plot.png."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raydist import registry
from raydist.atomic import write_json_atomic
from raydist.compare import tuned
from raydist.compare.childjob import run_job
from raydist.compare.report import (
    StrategyResult,
    accuracy_text,
    label,
    markdown_table,
    plot,
    read_curves,
    time_to_target,
)
from raydist.config import Config
from raydist.jobconfig import shared_config
from raydist.summary import SUMMARY_FILE, JobSummary

PROGRESS_MARK = "[raydist] "  # a job's progress lines, echoed as they come


def output_dir(cfg: Config) -> Path:
    return (
        Path(os.path.expanduser(cfg.compare.output_dir)).resolve() if cfg.compare.output_dir else Path(cfg.run.run_dir)
    )


def run_strategy(strategy: str, configs: list[Path], runs_dir: Path, index: str) -> JobSummary:
    """Run one strategy's job on `configs` (merged in this order) and read the summary.json it writes."""
    print(f"[compare] {index} {label(strategy)}: starting", flush=True)
    summary = JobSummary.read(run_job(strategy, configs, runs_dir, strategy, (PROGRESS_MARK,)))
    print(
        f"[compare] {index} {label(strategy)}: done, test_accuracy {accuracy_text(summary.test_accuracy)}, "
        f"{summary.wall_s:.1f} s",
        flush=True,
    )
    return summary


@dataclass
class CompareSummary:
    """jobs/compare.py's outcome, written as summary.json in its output directory."""

    strategy: str
    run_name: str
    run_dir: str
    workers: int
    wall_s: float
    results: str
    table: str
    plot: str
    test_accuracy: dict[str, float | None] = field(default_factory=dict)
    time_to_target_s: dict[str, float | None] = field(default_factory=dict)
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """compare.tune: each strategy's best settings from its sweep, which it ran at."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self) -> Path:
        return write_json_atomic(Path(self.run_dir) / SUMMARY_FILE, self.to_dict())


def compare(cfg: Config, started: float | None = None) -> CompareSummary:
    """Run the strategies one after another and write the three artefacts; returns the job's summary."""
    start = time.perf_counter() if started is None else started
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    shared_yaml = out / "shared.yaml"
    shared_yaml.write_text(yaml.safe_dump(shared_config(cfg), sort_keys=False))
    strategies = cfg.compare.strategy_list
    target = cfg.compare.target_accuracy
    print(
        f"[compare] {', '.join(label(s) for s in strategies)}: {cfg.scaling.num_workers} workers, "
        f"{cfg.train.epochs if not cfg.train.max_steps else cfg.train.max_steps} "
        f"{'epochs' if not cfg.train.max_steps else 'steps'}, straggler "
        f"{'none' if cfg.straggler.worker < 0 else f'worker {cfg.straggler.worker}'}; output in {out}",
        flush=True,
    )
    swept: dict[str, tuned.Swept] = {}
    if cfg.compare.tune:
        print(f"[compare] each strategy swept first: {tuned.describe(cfg)}", flush=True)
        for i, name in enumerate(strategies):
            swept[name] = tuned.sweep(cfg, name, out, f"(sweep {i + 1}/{len(strategies)})")
    results: dict[str, StrategyResult] = {}
    for i, name in enumerate(strategies):
        # At its best: the sweep's best settings, then the shared sections again (the same values they hold).
        configs = [swept[name].best_config, shared_yaml] if name in swept else [shared_yaml]
        summary = run_strategy(name, configs, out / "runs", f"({i + 1}/{len(strategies)})")
        curves = read_curves(summary.metrics_file)
        best = swept[name].best_values if name in swept else None
        results[name] = StrategyResult(summary, time_to_target(curves["eval"], target), curves, best)

    table = markdown_table(results, target)
    (out / "results.md").write_text(table)
    write_json_atomic(
        out / "results.json",
        {
            "target_accuracy": target,
            "shared_config": shared_config(cfg),
            "strategies": {k: dataclasses.asdict(v) for k, v in results.items()},
            "sweeps": {k: v.summary for k, v in swept.items()},
        },
    )
    plot(results, target, out / "plot.png", cfg.compare.plot_width, cfg.compare.plot_height)
    print("\n" + table, flush=True)
    if cfg.run.tensorboard:  # each run writes runs/<strategy>/tensorboard: their parent shows them side by side
        print(f"[compare] TensorBoard, every strategy: tensorboard --logdir {out / 'runs'}", flush=True)
    return CompareSummary(
        strategy="compare",
        run_name=cfg.run.name,
        run_dir=str(out),
        workers=cfg.scaling.max_workers,
        wall_s=round(time.perf_counter() - start, 3),
        results=str(out / "results.json"),
        table=str(out / "results.md"),
        plot=str(out / "plot.png"),
        test_accuracy={name: r.summary.test_accuracy for name, r in results.items()},
        time_to_target_s={name: r.time_to_target_s for name, r in results.items()},
        tuned={name: r.tuned for name, r in results.items() if r.tuned is not None},
    )


def run(cfg: Config, spec: registry.StrategySpec, session) -> CompareSummary:
    """The registry's driver for `compare`: each strategy's job starts (or joins) Ray itself."""
    return compare(cfg, session.started)
