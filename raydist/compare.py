"""jobs/compare.py's work: run each strategy's job on one shared setting, then write results.json, results.md and plot.png."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import yaml

from raydist.config import Config
from raydist.errors import RaydistError

REPO = Path(__file__).resolve().parents[1]
JOBS = {"sync": "sync.py", "local_sgd": "local_sgd.py", "async": "async.py"}
LABELS = {"sync": "sync DDP", "local_sgd": "local SGD", "async": "async PS"}
# What every strategy shares; optim and schedule stay each job's own (its tuned defaults in raydist/configs/).
SHARED_SECTIONS = ("model", "data", "train", "scaling", "checkpoint", "straggler", "local_sgd", "async_ps")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAY_PREFIX = re.compile(r"^\([^)]*\)\s*")  # Ray's "(RayTrainWorker pid=...)" on lines forwarded from workers


def output_dir(cfg: Config) -> Path:
    return Path(os.path.expanduser(cfg.compare.output_dir)).resolve() if cfg.compare.output_dir else Path(cfg.run.run_dir)


def shared_config(cfg: Config) -> dict[str, Any]:
    everything = cfg.to_dict()
    shared = {k: everything[k] for k in SHARED_SECTIONS}
    if cfg.run.address:
        shared["run"] = {"address": cfg.run.address}
    return shared


def run_strategy(strategy: str, shared_yaml: Path, runs_dir: Path, index: str) -> dict[str, Any]:
    """Run one job as a user would, echo its progress lines, and return its JSON summary."""
    run_dir = runs_dir / strategy
    shutil.rmtree(run_dir, ignore_errors=True)  # always a fresh run: a leftover checkpoint would resume instead
    cmd = [sys.executable, str(REPO / "jobs" / JOBS[strategy]), "--config", str(shared_yaml),
           "--set", f"run.storage_path={runs_dir}", "--set", f"run.name={strategy}"]
    print(f"[compare] {index} {LABELS[strategy]}: starting", flush=True)
    tail: deque[str] = deque(maxlen=40)
    summary = None
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = _RAY_PREFIX.sub("", _ANSI.sub("", raw.rstrip()))
            tail.append(line)
            if line.startswith("[raydist]"):
                text = line[len("[raydist] "):]
                text = text[len(strategy) + 2:] if text.startswith(f"{strategy}: ") else text
                print(f"[compare] {strategy}: {text}", flush=True)
            elif line.startswith("{"):
                try:
                    summary = json.loads(line)
                except json.JSONDecodeError:
                    pass
    if proc.returncode != 0 or summary is None:
        errors = [ln[len("raydist: error: "):] for ln in tail if ln.startswith("raydist: error: ")]
        why = errors[-1] if errors else next((ln for ln in reversed(tail) if ln.strip()), "no output")
        raise RaydistError(f"{strategy} run failed (exit {proc.returncode}): {why}")
    print(f"[compare] {index} {LABELS[strategy]}: done, test_accuracy {summary['test_accuracy']:.4f}, "
          f"{summary['wall_s']:.1f} s", flush=True)
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
    return next((t for t, acc, _ in evals if acc >= target), None)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def markdown_table(results: dict[str, dict[str, Any]], target: float) -> str:
    rows = [
        f"| strategy | final test accuracy | time to {target:g} accuracy (s) | samples/s | MB sent+received per worker "
        f"| wait per worker (s) | staleness mean | staleness max | job wall (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        s = r["summary"]
        reached = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.2f}"
        waits = " / ".join(f"{w:.2f}" for w in s.get("wait_s_per_worker", []))
        # Staleness is a parameter-server notion: sync and local SGD apply gradients to the weights they came from.
        stale = (f"{s['staleness_mean']:.2f}", str(s["staleness_max"])) if name == "async" else ("-", "-")
        rows.append(
            f"| {LABELS[name]} | {s['test_accuracy']:.4f} | {reached} | {s['samples_per_s']:.0f} "
            f"| {_mean(s.get('bytes_per_worker', [])) / 1e6:.1f} | {waits} | {stale[0]} | {stale[1]} | {s['wall_s']:.1f} |"
        )
    return "\n".join(rows) + "\n"


def plot(results: dict[str, dict[str, Any]], target: float, path: Path, width: int, height: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dpi = 100
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(width / dpi, height / dpi), dpi=dpi)
    for name, r in results.items():
        curves = r["curves"]
        line = None
        if curves["eval"]:
            t, acc, test_loss = zip(*curves["eval"])
            (line,) = acc_ax.plot(t, acc, marker=".", label=LABELS[name])
            loss_ax.plot(t, test_loss, linestyle="--", color=line.get_color(), label=f"{LABELS[name]} (test)")
        if curves["train_loss"]:
            t, loss = zip(*curves["train_loss"])
            loss_ax.plot(t, loss, color=line.get_color() if line else None, alpha=0.8, label=f"{LABELS[name]} (train)")
    acc_ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
    acc_ax.set(title="test accuracy", xlabel="wall-clock time since training started (s)", ylabel="accuracy")
    loss_ax.set(title="loss", xlabel="wall-clock time since training started (s)", ylabel="cross-entropy", yscale="log")
    acc_ax.legend(loc="lower right")
    loss_ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)  # no bbox_inches="tight": the file keeps exactly width x height pixels
    plt.close(fig)


def compare(cfg: Config) -> dict[str, Any]:
    """Run the strategies one after another and write the three artefacts; returns the job's summary."""
    start = time.perf_counter()
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    shared_yaml = out / "shared.yaml"
    shared_yaml.write_text(yaml.safe_dump(shared_config(cfg), sort_keys=False))
    strategies = cfg.compare.strategy_list
    target = cfg.compare.target_accuracy
    print(f"[compare] {', '.join(LABELS[s] for s in strategies)}: {cfg.scaling.num_workers} workers, "
          f"{cfg.train.epochs if not cfg.train.max_steps else cfg.train.max_steps} "
          f"{'epochs' if not cfg.train.max_steps else 'steps'}, straggler "
          f"{'none' if cfg.straggler.worker < 0 else f'worker {cfg.straggler.worker}'}; output in {out}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(strategies):
        summary = run_strategy(name, shared_yaml, out / "runs", f"({i + 1}/{len(strategies)})")
        curves = read_curves(summary["metrics_file"])
        results[name] = {"summary": summary, "time_to_target_s": time_to_target(curves["eval"], target), "curves": curves}

    table = markdown_table(results, target)
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps(
        {"target_accuracy": target, "shared_config": shared_config(cfg), "strategies": results}, indent=1))
    plot(results, target, out / "plot.png", cfg.compare.plot_width, cfg.compare.plot_height)
    print("\n" + table, flush=True)
    return {
        "strategy": "compare",
        "run_name": cfg.run.name,
        "workers": cfg.scaling.num_workers,
        "wall_s": round(time.perf_counter() - start, 3),
        "output_dir": str(out),
        "results": str(out / "results.json"),
        "table": str(out / "results.md"),
        "plot": str(out / "plot.png"),
        "test_accuracy": {name: r["summary"]["test_accuracy"] for name, r in results.items()},
        "time_to_target_s": {name: r["time_to_target_s"] for name, r in results.items()},
    }
