"""What a sweep leaves for people to read: results.md (a row per trial), results.json, best.yaml (the best trial's
settings, a config `jobs/<strategy>.py --config` takes as it is), plot.png (the metric against steps, every trial),
and the job's summary.json."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raydist.atomic import write_json_atomic
from raydist.config import Config
from raydist.summary import SUMMARY_FILE
from raydist.sweeps.trial import STOPPED

NOT_IN_BEST = ("run", "tune", "compare")  # where a trial lived and the sweep itself: not the settings


@dataclass
class TrialRow:
    trial: str
    values: dict[str, Any]
    metric: float | None  # its best over its evaluations
    steps: int | None
    time_s: float
    stopped_early: bool
    error: str | None
    unfinished: bool  # ended by the cluster's stop request: the restored sweep runs it again
    curve: list[tuple[int, float]]  # (step, metric) at each evaluation


@dataclass
class TuneSummary:
    """jobs/tune.py's outcome, written as summary.json in its run directory."""

    strategy: str
    run_name: str
    run_dir: str
    workers: int
    wall_s: float
    swept: str
    metric: str
    trials: int
    stopped_early: int
    errored: int
    best_trial: str | None
    best_metric: float | None
    best_values: dict[str, Any] = field(default_factory=dict)
    status: str = "completed"
    """completed, or stopped: the cluster's stop request left `unfinished` trials, which the same command resumes."""
    unfinished: int = 0
    best_config: str = ""
    table: str = ""
    plot: str = ""
    results: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def write(self) -> Path:
        return write_json_atomic(Path(self.run_dir) / SUMMARY_FILE, self.to_dict())


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def row(result: Any, metric: str, mode: str) -> TrialRow:
    """One trial of Tune's ResultGrid."""
    frame = result.metrics_dataframe
    records = [] if frame is None else frame.to_dict("records")
    curve = [
        (int(r["step"]), v) for r in records if (v := _number(r.get(metric))) is not None and _number(r.get("step"))
    ]
    values = [v for _, v in curve]
    best = (max if mode == "max" else min)(values) if values else None
    last = result.metrics or {}
    unfinished = result.error is not None and STOPPED in str(result.error)
    return TrialRow(
        trial=str(last.get("trial_id") or Path(result.path).name),
        values={k: v for k, v in (result.config or {}).items()},
        metric=best,
        steps=int(last["step"]) if _number(last.get("step")) is not None else None,
        time_s=round(float(last.get("time_total_s") or 0.0), 1),
        stopped_early=result.error is None and not any(r.get("completed") for r in records),
        error=str(result.error).strip().splitlines()[-1] if result.error and not unfinished else None,
        unfinished=unfinished,
        curve=curve,
    )


def markdown(rows: list[TrialRow], metric: str, keys: list[str]) -> str:
    head = ["trial", *keys, metric, "steps", "time (s)", "stopped early"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        value = "error: " + (r.error or "") if r.error else ("-" if r.metric is None else f"{r.metric:.4f}")
        shown = [f"{r.values.get(k):.4g}" if isinstance(r.values.get(k), float) else str(r.values.get(k)) for k in keys]
        lines.append(
            "| "
            + " | ".join([r.trial, *shown, value, str(r.steps or "-"), f"{r.time_s:.1f}", _ended(r)])
            + " |"  # fmt: skip
        )
    return "\n".join(lines) + "\n"


def _ended(r: TrialRow) -> str:
    return "unfinished (resumes)" if r.unfinished else "yes" if r.stopped_early else "no"


def plot(rows: list[TrialRow], metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    for r in rows:
        if r.curve:
            steps, values = zip(*r.curve)
            ax.plot(steps, values, marker=".", label=r.trial + (" (stopped)" if r.stopped_early else ""))
    ax.set(title=f"{metric} at each evaluation, every trial", xlabel="step", ylabel=metric)
    if any(r.curve for r in rows):
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def best_config(trials_dir: Path, trial: str) -> dict[str, Any]:
    """The best trial's whole config but where it lived: `jobs/<strategy>.py --config best.yaml` runs it."""
    cfg = yaml.safe_load((trials_dir / f"{trial}.yaml").read_text())
    return {k: v for k, v in cfg.items() if k not in NOT_IN_BEST}


def write(cfg: Config, grid: Any, trials_dir: Path, started: float) -> TuneSummary:
    import time

    out = Path(cfg.run.run_dir)
    metric, mode, keys = cfg.tune.metric, cfg.tune.mode, list(cfg.tune.space)
    rows = sorted((row(r, metric, mode) for r in grid), key=lambda r: r.trial)
    ranked = [r for r in rows if r.metric is not None]
    best = (max if mode == "max" else min)(ranked, key=lambda r: r.metric) if ranked else None
    table = markdown(rows, metric, keys)
    (out / "results.md").write_text(table)
    write_json_atomic(
        out / "results.json", {"metric": metric, "mode": mode, "trials": [dataclasses.asdict(r) for r in rows]}
    )
    plot(rows, metric, out / "plot.png")
    best_file = out / "best.yaml"
    if best is not None:
        best_file.write_text(yaml.safe_dump(best_config(trials_dir, best.trial), sort_keys=False))
    print("\n" + table, flush=True)
    if any(r.unfinished for r in rows):
        print(f"[tune] stopped at the cluster's stop request: {sum(r.unfinished for r in rows)} trial(s) unfinished; "
              "the same command resumes the sweep", flush=True)  # fmt: skip
    if best is not None:
        print(f"[tune] best: {best.trial} {metric} {best.metric:.4f} with {best.values}; "
              f"python jobs/{cfg.tune.strategy}.py --config {best_file}", flush=True)  # fmt: skip
    return TuneSummary(
        strategy="tune",
        run_name=cfg.run.name,
        run_dir=str(out),
        workers=cfg.scaling.max_workers,
        wall_s=round(time.perf_counter() - started, 3),
        swept=cfg.tune.strategy,
        metric=metric,
        trials=len(rows),
        stopped_early=sum(r.stopped_early for r in rows),
        errored=sum(r.error is not None for r in rows),
        status="stopped" if any(r.unfinished for r in rows) else "completed",
        unfinished=sum(r.unfinished for r in rows),
        best_trial=best.trial if best else None,
        best_metric=best.metric if best else None,
        best_values=best.values if best else {},
        best_config=str(best_file) if best else "",
        table=str(out / "results.md"),
        plot=str(out / "plot.png"),
        results=str(out / "results.json"),
    )
