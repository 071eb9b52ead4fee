"""The strategies side by side, as docs/strategies.md quotes them: `jobs/compare.py` (sync DDP, local SGD, async PS)
on 3 workers, digits, 20 epochs, without and with a straggler (worker 2 three times slower), several rounds.

    .venv/bin/python -m benchmarks.strategies_compare [--rounds 3]
    .venv/bin/python -m benchmarks.strategies_compare --rounds 3 --out docs/data/strategies_compare.json
    .venv/bin/python -m benchmarks.strategies_compare --report docs/data/strategies_compare.json  # the docs' tables

Each round runs both settings one after the other (interleaved, so a slower stretch of the machine touches both),
each as the user runs it: one `jobs/compare.py` process, which runs the strategies' jobs one after another. The
table gives each column's median over the rounds, the timed columns with their min-max.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import stored as stored_file
from tests.support.jobutil import clean_env

REPO = Path(__file__).resolve().parents[1]

SHARED = ["scaling.num_workers=3", "train.epochs=20"]
SETTINGS = {"calm": [], "straggler": ["straggler.worker=2", "straggler.slowdown=3"]}
TARGET = 0.95


def compare_once(storage: str, name: str, overrides: list[str]) -> dict[str, dict]:
    """One jobs/compare.py run; each strategy's row: its summary's figures and its time to the target."""
    args = [
        sys.executable,
        str(REPO / "jobs" / "compare.py"),
        "--set",
        f"run.storage_path={storage}",
        "--set",
        f"run.name={name}",
        "--set",
        f"compare.target_accuracy={TARGET}",
    ]
    for o in [*SHARED, *overrides]:
        args += ["--set", o]
    done = subprocess.run(args, cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    from raydist.compare.report import label, own_columns

    results = json.loads((Path(storage) / name / "results.json").read_text())["strategies"]
    keep = (
        "test_accuracy",
        "samples_per_s",
        "bytes_per_worker",
        "wait_s_per_worker",
        "wall_s",
        *(f for _, f, _ in own_columns(list(results))),
    )
    return {
        strategy: {
            **{k: r["summary"].get(k) for k in keep},
            "time_to_target_s": r["time_to_target_s"],
            "label": label(strategy),
        }
        for strategy, r in results.items()
    }


def _med(rounds: list[dict], key: str) -> float | None:
    values = [r[key] for r in rounds if r[key] is not None]
    return statistics.median(values) if values else None


def _timed(rounds: list[dict], key: str, digits: int) -> str:
    values = [r[key] for r in rounds if r[key] is not None]
    if not values:
        return "not reached"
    lo, mid, hi = min(values), statistics.median(values), max(values)
    shown = f"{mid:.{digits}f}" if len(values) == 1 else f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"
    return shown + ("" if len(values) == len(rounds) else f", {len(rounds) - len(values)} not reached")


def row(strategy: str, rounds: list[dict], strategies: list[str]) -> str:
    """One strategy's table row from its rounds: medians, the timed columns with their min-max."""
    from raydist.compare.report import own_columns, shown

    waits = " / ".join(
        f"{statistics.median(r['wait_s_per_worker'][i] for r in rounds):.2f}"
        for i in range(len(rounds[0]["wait_s_per_worker"]))
    )
    mb = statistics.median(statistics.mean(r["bytes_per_worker"]) for r in rounds) / 1e6
    own = "".join(f" {shown(_med(rounds, f), count)} |" for _, f, count in own_columns(strategies))
    return (
        f"| {rounds[0]['label']} | {_med(rounds, 'test_accuracy'):.4f} | {_timed(rounds, 'time_to_target_s', 2)} "
        f"| {_timed(rounds, 'samples_per_s', 0)} | {mb:.1f} | {waits} |{own} {_timed(rounds, 'wall_s', 1)} |"
    )


def table(stored: dict, setting: str) -> str:
    from raydist.compare.report import header

    runs = [r[setting] for r in stored["rounds"]]
    strategies = list(runs[0])
    rows = [row(s, [run[s] for run in runs], strategies) for s in strategies]
    return "\n".join([header(strategies, TARGET), *rows]) + "\n"


def kept(stored: dict) -> str:
    """What share of its samples/s each strategy keeps with the straggler, median over the rounds."""
    shares = []
    for strategy in stored["rounds"][0]["calm"]:
        ratios = [
            r["straggler"][strategy]["samples_per_s"] / r["calm"][strategy]["samples_per_s"] for r in stored["rounds"]
        ]
        shares.append(f"{stored['rounds'][0]['calm'][strategy]['label']} {statistics.median(ratios):.2f}")
    return (
        "With the straggler each keeps this share of its samples/s (median of the rounds' ratios): "
        + ", ".join(shares)
        + ".\n"
    )


def report(stored: dict) -> str:
    """The two tables docs/strategies.md quotes, with the number of rounds behind them."""
    n = len(stored["rounds"])
    return (
        f"Without a straggler (median of {n} rounds; min-max in brackets):\n\n{table(stored, 'calm')}\n"
        f"With worker 2 three times slower (`--set straggler.worker=2 --set straggler.slowdown=3`):\n\n"
        f"{table(stored, 'straggler')}\n{kept(stored)}"
    )


def measure(args) -> dict:
    def one_round(storage: str, i: int) -> dict:
        return {setting: compare_once(storage, f"{setting}{i}", overrides) for setting, overrides in SETTINGS.items()}

    return {
        "shared": SHARED,
        "settings": SETTINGS,
        "target_accuracy": TARGET,
        "rounds": stored_file.rounds(args.rounds, "rd-compare-", one_round),
    }


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=3)
    stored_file.cli(ap, "docs/data/strategies_compare.json", report, measure)


if __name__ == "__main__":
    main()
