"""jobs/compare.py's work: run each strategy's job on one shared setting, then write results.json, results.md and plot.png."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raydist import registry
from raydist.atomic import write_json_atomic
from raydist.config import COMMON_SECTIONS, Config, job_defaults
from raydist.errors import RaydistError
from raydist.summary import SUMMARY_FILE, JobSummary
from raydist.typedconfig import apply, merge, validate

REPO = Path(__file__).resolve().parents[2]
# What every strategy's job takes from compare's config: the common sections but optim and schedule, which stay
# each job's own (its tuned defaults: `StrategySpec.defaults_file`), and run (each job gets its own directory);
# and every strategy's own section.
SHARED_SECTIONS = (
    *(s for s in COMMON_SECTIONS if s not in ("optim", "schedule", "run")),
    *(spec.section for spec in registry.STRATEGIES.values() if spec.section),
)
PROGRESS_MARK = "[raydist] "  # a job's progress lines, echoed as they come


def label(strategy: str) -> str:
    return registry.get(strategy).label


def output_dir(cfg: Config) -> Path:
    return (
        Path(os.path.expanduser(cfg.compare.output_dir)).resolve() if cfg.compare.output_dir else Path(cfg.run.run_dir)
    )


def shared_config(cfg: Config) -> dict[str, Any]:
    everything = cfg.to_dict()
    shared = {k: everything[k] for k in SHARED_SECTIONS}
    if cfg.run.address:
        shared["run"] = {"address": cfg.run.address}
    if not cfg.run.tensorboard:  # the only other run key each strategy's job takes from compare's command line
        shared.setdefault("run", {})["tensorboard"] = False
    return shared


def strategy_config(cfg: Config, strategy: str, runs_dir: Path) -> Config:
    """The config `run_strategy` gives `strategy`'s job: its own defaults, the shared sections, its run directory
    (so that its checks run here, before the first job starts)."""
    own = merge(Config(), [p] if (p := job_defaults(strategy)) else [])
    shared = shared_config(cfg)
    apply(own, {**shared, "run": {**shared.get("run", {}), "storage_path": str(runs_dir), "name": strategy}})
    return validate(own)


def run_strategy(strategy: str, shared_yaml: Path, runs_dir: Path, index: str) -> JobSummary:
    """Run one strategy's job as a user would, echo its progress lines, and read the summary.json it writes."""
    run_dir = runs_dir / strategy
    shutil.rmtree(run_dir, ignore_errors=True)  # always a fresh run: a leftover checkpoint would resume instead
    cmd = [
        sys.executable,
        "-m",
        "raydist.job",
        strategy,
        "--config",
        str(shared_yaml),
        "--set",
        f"run.storage_path={runs_dir}",
        "--set",
        f"run.name={strategy}",
    ]
    print(f"[compare] {index} {label(strategy)}: starting", flush=True)
    tail: deque[str] = deque(maxlen=40)
    # In this directory, as a user's job: the user's own package (model.factory, data.factory) imports from it.
    here = os.getcwd()
    path = [here, str(REPO), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    with subprocess.Popen(
        cmd, cwd=here, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            if PROGRESS_MARK in line:  # Ray may prefix a worker's line with "(RayTrainWorker pid=...)"
                text = line.split(PROGRESS_MARK, 1)[1].rstrip()
                text = text.removeprefix(f"{strategy}: ")
                print(f"[compare] {strategy}: {text}", flush=True)
    if proc.returncode != 0 or not (run_dir / SUMMARY_FILE).is_file():
        # The job's own one-line error (`raydist: error: ...`), else its last words.
        errors = [ln.split("raydist: error: ", 1)[1] for ln in tail if "raydist: error: " in ln]
        why = errors[-1] if errors else next((ln for ln in reversed(tail) if ln.strip()), "no output")
        raise RaydistError(f"{strategy} run failed (exit {proc.returncode}): {why}")
    summary = JobSummary.read(run_dir)
    print(
        f"[compare] {index} {label(strategy)}: done, test_accuracy {_accuracy(summary.test_accuracy)}, "
        f"{summary.wall_s:.1f} s",
        flush=True,
    )
    return summary


def read_curves(metrics_file: str) -> dict[str, list]:
    """Evaluations (time, accuracy, test loss) and the training loss over time, averaged into at most 100 bins."""
    evals, losses = [], []
    with open(metrics_file) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if "eval_at_step" in r:
                evals.append([r["time_s"], r["test_accuracy"], r["test_loss"]])
            elif "loss" in r and "time_s" in r:
                losses.append((r["time_s"], r["loss"]))
    binned: list[list[float]] = []
    if losses:
        end = max(t for t, _ in losses) or 1.0
        bins: dict[int, list[float]] = {}
        for t, loss in losses:
            bins.setdefault(min(99, int(100 * t / end)), []).append(loss)
        binned = [[(b + 0.5) * end / 100, sum(v) / len(v)] for b, v in sorted(bins.items())]
    return {"eval": sorted(evals), "train_loss": binned}


def time_to_target(evals: list[list[float]], target: float) -> float | None:
    return next((t for t, acc, _ in evals if acc is not None and acc >= target), None)


def _accuracy(value: float | None) -> str:
    """A test accuracy for the table; '-' where targets are not classes (a regression's own loss)."""
    return "-" if value is None else f"{value:.4f}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclass
class StrategyResult:
    """One strategy's entry in results.json: its job summary, curves and time to the target accuracy."""

    summary: JobSummary
    time_to_target_s: float | None
    curves: dict[str, list]


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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self) -> Path:
        return write_json_atomic(Path(self.run_dir) / SUMMARY_FILE, self.to_dict())


def own_columns(strategies: list[str]) -> list[tuple[str, str, bool]]:
    """(header, summary field, whether it counts) of the columns the given strategies declare for the table
    (`raydist.summary_fields.described(compare=...)` in a strategy's summary.py), in registry order."""
    columns: list[tuple[str, str, bool]] = []
    for spec in registry.all_specs():
        if spec.name in strategies and spec.summary_fields:
            for f in dataclasses.fields(spec.load("summary_fields")):
                column = (f.metadata.get("compare", ""), f.name, str(f.type).startswith("int"))
                if column[0] and column not in columns:
                    columns.append(column)
    return columns


def shown(value: float | None, count: bool) -> str:
    """A strategy's own figure ('-' in the rows of strategies without it): a count as `g` shows it (a median of
    counts may fall between two), a measure with two decimals."""
    return "-" if value is None else f"{value:g}" if count else f"{value:.2f}"


def header(strategies: list[str], target: float) -> str:
    heads = [
        "strategy",
        "final test accuracy",
        f"time to {target:g} accuracy (s)",
        "samples/s",
        "MB sent+received per worker",
        "wait per worker (s)",
        *(column[0] for column in own_columns(strategies)),
        "job wall (s)",
    ]
    return "| " + " | ".join(heads) + " |\n" + "|---" * len(heads) + "|"


def markdown_table(results: dict[str, StrategyResult], target: float) -> str:
    columns = own_columns(list(results))
    rows = [header(list(results), target)]
    for name, r in results.items():
        s = r.summary
        reached = "not reached" if r.time_to_target_s is None else f"{r.time_to_target_s:.2f}"
        waits = " / ".join(f"{w:.2f}" for w in s.wait_s_per_worker)
        own = "".join(f" {shown(getattr(s, f), count)} |" for _, f, count in columns)
        rows.append(
            f"| {label(name)} | {_accuracy(s.test_accuracy)} | {reached} | {s.samples_per_s:.0f} "
            f"| {_mean(s.bytes_per_worker) / 1e6:.1f} | {waits} |{own} {s.wall_s:.1f} |"
        )
    return "\n".join(rows) + "\n"


def plot(results: dict[str, StrategyResult], target: float, path: Path, width: int, height: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dpi = 100
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(width / dpi, height / dpi), dpi=dpi)
    for name, r in results.items():
        curves, name_ = r.curves, label(name)
        line = None
        if curves["eval"]:
            t, acc, test_loss = zip(*curves["eval"])
            acc = [float("nan") if a is None else a for a in acc]  # no accuracy where targets are not classes
            (line,) = acc_ax.plot(t, acc, marker=".", label=name_)
            loss_ax.plot(t, test_loss, linestyle="--", color=line.get_color(), label=f"{name_} (test)")
        if curves["train_loss"]:
            t, loss = zip(*curves["train_loss"])
            loss_ax.plot(t, loss, color=line.get_color() if line else None, alpha=0.8, label=f"{name_} (train)")
    acc_ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
    acc_ax.set(title="test accuracy", xlabel="wall-clock time since training started (s)", ylabel="accuracy")
    loss_ax.set(title="loss", xlabel="wall-clock time since training started (s)", ylabel="cross-entropy", yscale="log")
    acc_ax.legend(loc="lower right")
    loss_ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)  # no bbox_inches="tight": the file keeps exactly width x height pixels
    plt.close(fig)


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
    results: dict[str, StrategyResult] = {}
    for i, name in enumerate(strategies):
        summary = run_strategy(name, shared_yaml, out / "runs", f"({i + 1}/{len(strategies)})")
        curves = read_curves(summary.metrics_file)
        results[name] = StrategyResult(summary, time_to_target(curves["eval"], target), curves)

    table = markdown_table(results, target)
    (out / "results.md").write_text(table)
    write_json_atomic(
        out / "results.json",
        {
            "target_accuracy": target,
            "shared_config": shared_config(cfg),
            "strategies": {k: dataclasses.asdict(v) for k, v in results.items()},
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
    )


def run(cfg: Config, spec: registry.StrategySpec, session) -> CompareSummary:
    """The registry's driver for `compare`: each strategy's job starts (or joins) Ray itself."""
    return compare(cfg, session.started)
