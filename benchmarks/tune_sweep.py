"""What a sweep finds and what it costs: jobs/tune.py over a grid of learning rates with ASHA, against the same
points run to the end one after another (tune.scheduler=fifo), on the straggler setting.

    .venv/bin/python -m benchmarks.tune_sweep --out docs/data/tune_sweep.json
    .venv/bin/python -m benchmarks.tune_sweep --report docs/data/tune_sweep.json

Each round runs both sweeps (alternating which goes first) from fresh run directories: the same grid of
`optim.lr`, one trial per point, the strategy's job on digits with `scaling.num_workers` workers, worker 1 slowed
down `--slowdown` times. Stored per sweep: every trial (its rate, best test accuracy, steps, seconds, stopped early
or not), the sweep's wall time, and the trials' seconds times their CPUs (core-seconds held). Trials run one at a
time here: two workers fill the two cores.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.stored import REPO, cli, parser, rounds, spread

SCHEDULERS = ("asha", "fifo")


def sweep(storage: str, scheduler: str, args) -> dict:
    overrides = [
        f"run.storage_path={storage}",
        f"run.name={scheduler}",
        f"tune.strategy={args.strategy}",
        f"tune.space.optim.lr=grid([{', '.join(str(x) for x in args.lrs)}])",
        "tune.num_samples=1",
        f"tune.scheduler={scheduler}",
        f"train.epochs={args.epochs}",
        f"scaling.num_workers={args.workers}",
        "straggler.worker=1",
        f"straggler.slowdown={args.slowdown}",
        "run.tensorboard=false",
    ]
    cmd = [sys.executable, str(REPO / "jobs" / "tune.py"), *sum((["--set", o] for o in overrides), [])]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"tune_sweep: error: {scheduler} sweep exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    results = json.loads((Path(storage) / scheduler / "results.json").read_text())
    trials = [
        {k: t[k] for k in ("trial", "values", "metric", "steps", "time_s", "stopped_early", "error")}
        for t in results["trials"]
    ]
    return {
        "wall_s": round(wall, 1),
        "trials": trials,
        "trial_s": round(sum(t["time_s"] for t in trials), 1),
        "core_s": round(sum(t["time_s"] for t in trials) * args.workers, 1),
        "stopped_early": sum(t["stopped_early"] for t in trials),
        "best": max((t for t in trials if t["metric"] is not None), key=lambda t: t["metric"]),
    }


def measure(args) -> dict:
    def one(storage: str, i: int) -> dict:
        order = SCHEDULERS if i % 2 == 0 else SCHEDULERS[::-1]
        return {s: sweep(f"{storage}/r{i}", s, args) for s in order}

    return {
        "strategy": args.strategy,
        "lrs": args.lrs,
        "epochs": args.epochs,
        "workers": args.workers,
        "slowdown": args.slowdown,
        "rounds": rounds(args.rounds, "rd-tune-", one),
    }


def report(data: dict) -> str:
    r = data["rounds"]
    per = {s: [x[s] for x in r] for s in SCHEDULERS}
    best = {s: [x["best"] for x in per[s]] for s in SCHEDULERS}
    ratio = [a["core_s"] / f["core_s"] for a, f in zip(per["asha"], per["fifo"])]
    rates = sorted({b["values"]["optim.lr"] for s in SCHEDULERS for b in best[s]})
    lines = [
        f"{data['strategy']} over optim.lr in {data['lrs']}, {data['epochs']} epochs, {data['workers']} workers, "
        f"worker 1 slowed {data['slowdown']}x; {len(r)} round(s) on {data['machine']['cpus']} CPUs "
        f"({data['commit'][:7]}, {data['date']}); median (min-max):",
        "",
        "| | ASHA | every trial to its end (fifo) |",
        "|---|---|---|",
        f"| trials | {len(data['lrs'])} | {len(data['lrs'])} |",
        f"| stopped early | {spread([x['stopped_early'] for x in per['asha']], 0)} | 0 |",
        f"| trial time, core-seconds | {spread([x['core_s'] for x in per['asha']])} | "
        f"{spread([x['core_s'] for x in per['fifo']])} |",
        f"| the sweep's wall time (s) | {spread([x['wall_s'] for x in per['asha']])} | "
        f"{spread([x['wall_s'] for x in per['fifo']])} |",
        f"| best test accuracy | {spread([b['metric'] for b in best['asha']], 3)} | "
        f"{spread([b['metric'] for b in best['fifo']], 3)} |",
        "",
        f"ASHA's core-seconds over fifo's: {spread(ratio, 2)}x. The best rate found: "
        f"{', '.join(str(x) for x in rates)} (each round and sweep's best: "
        f"{statistics.mode([b['values']['optim.lr'] for s in SCHEDULERS for b in best[s]])} most often).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = parser(__doc__, rounds=2)
    ap.add_argument("--strategy", default="sync")
    ap.add_argument(
        "--lrs", type=lambda s: [float(x) for x in s.split(",")], default=[0.001, 0.003, 0.01, 0.03, 0.1, 0.3]
    )
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--slowdown", type=float, default=2.0)
    cli(ap, "docs/data/tune_sweep.json", report, measure)


if __name__ == "__main__":
    main()
