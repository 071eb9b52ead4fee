"""SIGKILL training workers at random moments of a Ray Train run: it must finish its whole step budget, restarting
from its checkpoints, with the test accuracy of an undisturbed run of the same config.

    .venv/bin/python -m benchmarks.train_chaos [--kills 5] [--seed 0] [--strategy sync] [--set KEY=VALUE]...
    .venv/bin/python -m benchmarks.train_chaos --kills 5 --out docs/data/train_chaos.json   # stored, as docs quote
    .venv/bin/python -m benchmarks.train_chaos --report docs/data/train_chaos.json          # docs/faults.md's lines

Runs the undisturbed reference and the disturbed run one after the other (real Ray, real gloo, the job as a user
starts it). A kill waits for the run to make progress since the previous one (new records in metrics.jsonl, so
each lands in a live worker group), then a random delay, then SIGKILLs a random `ray::RayTrainWorker` process of
the job. tests/test_faults.py runs a short version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import stored as stored_file
from tests.support.jobutil import job_processes_titled, start_job

REPO = Path(__file__).resolve().parents[1]

BASE = ["train.epochs=10", "checkpoint.every_steps=10", "train.report_every_s=0.5"]


def _records(metrics: Path) -> int:
    return sum(1 for _ in metrics.open()) if metrics.exists() else 0


def run(storage: str, name: str, kills: int, seed: int, strategy: str = "sync", overrides: list[str] = ()) -> dict:
    """One job, with `kills` worker SIGKILLs; returns its summary plus the kills that landed and the time taken."""
    rng = random.Random(seed)
    started = time.perf_counter()
    proc = start_job(
        strategy,
        f"run.storage_path={storage}",
        f"run.name={name}",
        f"scaling.max_failures={kills + 1}",
        *BASE,
        *overrides,
    )
    metrics = Path(storage) / name / "metrics.jsonl"
    landed = 0
    try:
        while landed < kills and proc.poll() is None:
            seen = _records(metrics)
            while proc.poll() is None and _records(metrics) < seen + 15:  # the group trains again
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 0.3))
            workers = job_processes_titled(proc, "ray::RayTrainWorker")
            if proc.poll() is not None or not workers:
                continue
            try:
                os.kill(rng.choice(workers), signal.SIGKILL)
                landed += 1
            except ProcessLookupError:
                pass
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}")
    summary = json.loads((Path(storage) / name / "summary.json").read_text())
    result = {**summary, "kills": landed, "seconds": time.perf_counter() - started, "traceback": "Traceback" in err}
    if result["traceback"]:  # what a failed check must show: which process printed it, and why
        at = err.index("Traceback")
        result["traceback_context"] = err[max(0, at - 1500) : at + 2500]
    return result


def report(stored: dict) -> str:
    """The lines docs/faults.md quotes: each run, the accuracy difference, and the time a kill cost."""
    calm, hit, name = stored["undisturbed"], stored["disturbed"], stored["strategy"]
    lines = [
        f"{name} {label}: {s['status']}, {s['steps']}/{s['total_steps']} steps, test accuracy "
        f"{s['test_accuracy']:.4f}, final loss {s['final_loss']:.6g}, {s['seconds']:.0f} s"
        for label, s in (("undisturbed", calm), (f"{hit['kills']} SIGKILLs", hit))
    ]
    diff = abs(hit["test_accuracy"] - calm["test_accuracy"])
    lines.append(
        f"accuracy difference {diff:.4f} {'OK' if ok(stored) else 'FAILED'}; "
        f"{(hit['seconds'] - calm['seconds']) / max(1, hit['kills']):.1f} s more per kill"
    )
    return "\n".join(lines) + "\n"


def ok(stored: dict) -> bool:
    calm, hit = stored["undisturbed"], stored["disturbed"]
    return (
        hit["status"] == "completed"
        and hit["steps"] == hit["total_steps"]
        and abs(hit["test_accuracy"] - calm["test_accuracy"]) <= 0.01
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strategy", default="sync", choices=["sync", "local_sgd", "heal"])
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    stored_file.add_options(ap, "docs/data/train_chaos.json")
    args = ap.parse_args()
    if stored_file.print_report(args.report, report):
        return
    machine_and_commit = stored_file.stamp()
    with tempfile.TemporaryDirectory(prefix="rd-train-chaos-") as storage:
        calm = run(storage, "calm", 0, args.seed, args.strategy, args.overrides)
        hit = run(storage, "chaos", args.kills, args.seed, args.strategy, args.overrides)
    stored = {
        "strategy": args.strategy,
        "seed": args.seed,
        "overrides": [*BASE, *args.overrides],
        "undisturbed": calm,
        "disturbed": hit,
    }
    print(report(stored), end="", flush=True)
    stored_file.save(args.out, stored, machine_and_commit)
    sys.exit(0 if ok(stored) else 1)


if __name__ == "__main__":
    main()
