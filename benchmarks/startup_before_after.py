"""Where `jobs/sync.py`'s seconds before the first step go, an earlier commit against this tree, interleaved rounds.

    .venv/bin/python -m benchmarks.startup_before_after --before 538bd5a --rounds 5 --out docs/data/startup_before_after.json
    .venv/bin/python -m benchmarks.startup_before_after --report docs/data/startup_before_after.json  # the docs' table

Exports the `--before` commit into a temporary directory (`git archive`) and runs the same command from each tree
on the embedded Ray instance, alternating which goes first; PYTHONPATH names the tree, so the driver and every Ray
process import its raydist (the same venv: same Ray, same torch). Per run: the job's own `startup_s` split, Ray
Train's steps read from the session's logs (benchmarks/train_startup_split.py), the first step's seconds from the
command's launch (the loop's `startup` record), the whole command's, and the CPU time the whole machine spent
meanwhile (/proc/stat: Ray's daemons and every process the job started, as the test suite pays it). The paired difference per round (before
minus after) is the figure: the machine's drift between rounds cancels out. Runs nothing else with Ray beside it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import stored as stored_file
from benchmarks.stored import busy_cpu_s, spread
from benchmarks.train_startup_split import split
from raydist.observability.metrics import startup_records
from tests.support.jobutil import clean_env

REPO = Path(__file__).resolve().parents[1]

SESSION = "/tmp/ray/session_latest"
JOB = ["--set", "scaling.num_workers=2", "--set", "run.tensorboard=false"]


def one_run(tree: Path, storage: Path, name: str) -> dict:
    launched, cpu = time.time(), busy_cpu_s()
    proc = subprocess.run(
        [sys.executable, "jobs/sync.py", *JOB, "--set", f"run.storage_path={storage}", "--set", f"run.name={name}"],
        cwd=tree,
        env=clean_env(PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    cpu = busy_cpu_s() - cpu
    if proc.returncode != 0:
        sys.exit(f"{name} failed in {tree}: {proc.stderr[-2000:]}")
    summary = json.loads((storage / name / "summary.json").read_text())
    return {
        "first_step_s": round(startup_records(str(storage / name / "metrics.jsonl"))[0]["first_step"] - launched, 2),
        "command_s": round(time.time() - launched, 2),
        "machine_cpu_s": round(cpu, 2),
        "startup_s": summary["startup_s"],
        "train_split_s": {k: round(v, 2) for k, v in split(str(Path(SESSION).resolve())).items()},
    }


def measure(args) -> dict:
    before = subprocess.run(
        ["git", "rev-parse", args.before], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="rd-before-") as old, tempfile.TemporaryDirectory(prefix="rd-ba-") as tmp:
        subprocess.run(f"git archive {before} | tar -x -C {old}", shell=True, cwd=REPO, check=True)
        trees = {"before": Path(old), "after": REPO}
        for i in range(args.rounds):
            row = {}
            for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
                row[side] = one_run(trees[side], Path(tmp), f"{side}{i}")
            rows.append(row)
            print(
                json.dumps(
                    {"round": i, "before": row["before"]["first_step_s"], "after": row["after"]["first_step_s"]}
                ),
                file=sys.stderr,
                flush=True,
            )
    return {"before_commit": before, "job": JOB, "rounds": rows}


def report(stored: dict) -> str:
    rows = stored["rounds"]
    out = ["| seconds | before | after |", "|---|---|---|"]
    for key in ("connect", "workers", "ready", "first_step"):
        out.append(
            f"| `{key}` (since the job's start) | {spread([r['before']['startup_s'][key] for r in rows])} "
            f"| {spread([r['after']['startup_s'][key] for r in rows])} |"
        )
    steps = dict.fromkeys([*rows[0]["before"]["train_split_s"], *rows[0]["after"]["train_split_s"]])
    for key in steps:  # a step one side does not have (a process it does not start): "-"
        cells = [
            spread([r[side]["train_split_s"][key] for r in rows]) if key in rows[0][side]["train_split_s"] else "-"
            for side in ("before", "after")
        ]
        out.append(f"| Ray Train: {key} | {cells[0]} | {cells[1]} |")
    for key, label in (
        ("first_step_s", "first step, from the command's launch"),
        ("command_s", "whole command"),
        ("machine_cpu_s", "machine CPU during the command"),
    ):
        if key in rows[0]["after"]:
            out.append(
                f"| {label} | {spread([r['before'][key] for r in rows])} | {spread([r['after'][key] for r in rows])} |"
            )
    gain = [r["before"]["first_step_s"] - r["after"]["first_step_s"] for r in rows]
    out += [
        "",
        f"The first step came {spread(gain)} s sooner (before minus after, paired by round; median, min-max of "
        f"{len(rows)} rounds), {statistics.median(gain) / statistics.median(r['before']['first_step_s'] for r in rows):.0%} "
        f"of the before median. Before: {stored['before_commit'][:7]}; after: {stored.get('commit', 'this tree')[:7]}"
        f"; {stored.get('machine', {}).get('cpus', '?')} CPUs, {stored.get('date', 'today')}.",
    ]
    if "machine_cpu_s" in rows[0]["after"]:
        cpu = [r["before"]["machine_cpu_s"] - r["after"]["machine_cpu_s"] for r in rows]
        out[-1] += (
            f" The machine spent {spread(cpu)} s of CPU less per run (paired), "
            f"{statistics.median(cpu) / statistics.median(r['before']['machine_cpu_s'] for r in rows):.0%} of "
            f"the before median."
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=5)
    ap.add_argument("--before", default="538bd5a", help="the earlier commit (default: before the start-up changes)")
    stored_file.cli(ap, "docs/data/startup_before_after.json", report, measure)


if __name__ == "__main__":
    main()
