"""The strategies side by side, each at its own best learning rate: `jobs/compare.py --set compare.tune=true` on
strategies_compare's setting (3 workers, digits, 20 epochs, without and with a straggler). Each strategy's sweep
gets the same budget (the grid below, ASHA on test accuracy), then compare runs each at its best, as
docs/strategies.md quotes it beside the table at each job's default settings (benchmarks/strategies_compare.py).

    .venv/bin/python -m benchmarks.strategies_tuned [--rounds 1]
    .venv/bin/python -m benchmarks.strategies_tuned --rounds 2 --out docs/data/strategies_tuned.json
    .venv/bin/python -m benchmarks.strategies_tuned --report docs/data/strategies_tuned.json  # the docs' tables

Each round runs both settings one after the other, each as the user runs it: one `jobs/compare.py` process, which
sweeps each strategy (one tune job each) and then runs the strategies' jobs one after another.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import stored as stored_file
from benchmarks.strategies_compare import SETTINGS, SHARED, TARGET, _timed
from tests.support.jobutil import clean_env

REPO = Path(__file__).resolve().parents[1]
GRID = [0.001, 0.003, 0.01, 0.03, 0.1]
SWEEP = [
    "compare.tune=true",
    f"tune.space.optim.lr=grid({GRID})",
    "tune.num_samples=1",
    "tune.scheduler=asha",
    "tune.metric=test_accuracy",
]


def compare_once(storage: str, name: str, overrides: list[str]) -> dict[str, dict]:
    """One tuned jobs/compare.py run; each strategy's row: its best rate, its run's figures, its sweep's cost."""
    args = [sys.executable, str(REPO / "jobs" / "compare.py")]
    for o in [f"run.storage_path={storage}", f"run.name={name}", f"compare.target_accuracy={TARGET}", *SHARED,
              *SWEEP, *overrides]:  # fmt: skip
        args += ["--set", o]
    done = subprocess.run(args, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=7200)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    from raydist.compare.report import label

    results = json.loads((Path(storage) / name / "results.json").read_text())
    rows = {}
    for strategy, r in results["strategies"].items():
        sweep = results["sweeps"][strategy]
        trials = json.loads(Path(sweep["results"]).read_text())["trials"]
        rows[strategy] = {
            "label": label(strategy),
            "lr": r["tuned"]["optim.lr"],
            "test_accuracy": r["summary"]["test_accuracy"],
            "time_to_target_s": r["time_to_target_s"],
            "samples_per_s": r["summary"]["samples_per_s"],
            "wall_s": r["summary"]["wall_s"],
            "sweep_wall_s": sweep["wall_s"],
            "sweep_trials": sweep["trials"],
            "sweep_stopped_early": sweep["stopped_early"],
            "sweep_best_accuracy": sweep["best_metric"],
            "trials": [{k: t[k] for k in ("values", "metric", "steps", "time_s", "stopped_early")} for t in trials],
        }
    return rows


def table(stored: dict, setting: str) -> str:
    runs = [r[setting] for r in stored["rounds"]]
    lines = [
        f"| strategy | best rate (each round) | final test accuracy | time to {TARGET:g} accuracy (s) | samples/s "
        "| job wall (s) | sweep: trials, stopped early | sweep wall (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in runs[0]:
        rounds = [run[s] for run in runs]
        rates = ", ".join(f"{r['lr']:g}" for r in rounds)
        stopped = "; ".join(f"{r['sweep_trials']}, {r['sweep_stopped_early']}" for r in rounds)
        accuracy = statistics.median(r["test_accuracy"] for r in rounds)
        lines.append(
            f"| {rounds[0]['label']} | {rates} | {accuracy:.4f} | {_timed(rounds, 'time_to_target_s', 2)} "
            f"| {_timed(rounds, 'samples_per_s', 0)} | {_timed(rounds, 'wall_s', 1)} | {stopped} "
            f"| {_timed(rounds, 'sweep_wall_s', 0)} |"
        )
    return "\n".join(lines) + "\n"


def report(stored: dict) -> str:
    n = len(stored["rounds"])
    grid = ", ".join(f"{x:g}" for x in stored["grid"])
    return (
        f"Each strategy swept over optim.lr in {{{grid}}} (ASHA on test accuracy), then run at its best; median of "
        f"{n} round(s), min-max in brackets.\n\nWithout a straggler:\n\n{table(stored, 'calm')}\n"
        f"With worker 2 three times slower:\n\n{table(stored, 'straggler')}"
    )


def measure(args) -> dict:
    def one_round(storage: str, i: int) -> dict:
        return {setting: compare_once(storage, f"{setting}{i}", overrides) for setting, overrides in SETTINGS.items()}

    return {
        "shared": SHARED,
        "settings": SETTINGS,
        "sweep": SWEEP,
        "grid": GRID,
        "target_accuracy": TARGET,
        "rounds": stored_file.rounds(args.rounds, "rd-tuned-", one_round),
    }


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=1)
    stored_file.cli(ap, "docs/data/strategies_tuned.json", report, measure)


if __name__ == "__main__":
    main()
