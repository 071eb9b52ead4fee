"""What compare shows: each strategy's curves and time to the target accuracy, the table and the plot."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydist import registry
from raydist.summary import JobSummary


def label(strategy: str) -> str:
    return registry.get(strategy).label


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


def accuracy_text(value: float | None) -> str:
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
    tuned: dict[str, Any] | None = None
    """compare.tune: the settings its sweep found best, which it ran at."""


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


def settings_text(values: dict[str, Any]) -> str:
    """A sweep's best settings for the table: `optim.lr 0.0123`."""
    return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()) or "-"


def header(strategies: list[str], target: float, tuned: bool = False) -> str:
    heads = [
        "strategy",
        *(["settings (best of its sweep)"] if tuned else []),
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
    tuned = any(r.tuned is not None for r in results.values())
    rows = [header(list(results), target, tuned)]
    for name, r in results.items():
        s = r.summary
        reached = "not reached" if r.time_to_target_s is None else f"{r.time_to_target_s:.2f}"
        waits = " / ".join(f"{w:.2f}" for w in s.wait_s_per_worker)
        own = "".join(f" {shown(getattr(s, f), count)} |" for _, f, count in columns)
        best = f" {settings_text(r.tuned or {})} |" if tuned else ""
        rows.append(
            f"| {label(name)} |{best} {accuracy_text(s.test_accuracy)} | {reached} | {s.samples_per_s:.0f} "
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
