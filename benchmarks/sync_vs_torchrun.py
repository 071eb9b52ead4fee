"""jobs/sync.py (Ray Train, embedded Ray) against the same loop under plain torchrun, interleaved rounds.

    .venv/bin/python -m benchmarks.sync_vs_torchrun --rounds 3 --out docs/data/sync_vs_torchrun.json
    .venv/bin/python -m benchmarks.sync_vs_torchrun --report docs/data/sync_vs_torchrun.json   # the docs' tables

Both run the shared loop (raydist.train.Trainer with SyncDDP) with gloo on CPU; only the launcher differs. Per round:
`first step`, the time from launching the command to rank 0's first step done (the loop's `startup` record in
metrics.jsonl); `command`, launch to exit; `loop`, the steps/s the loop measures itself (set-up excluded); Ray's own
split of its start-up (the summary's `startup_s`, and Ray Train's steps read from the session's logs by
benchmarks/train_startup_split.py); and `again`, the same jobs/sync.py command run a second time on the completed
run (it reports the run without starting Ray). Rounds alternate which side goes first. This benchmark starts the
embedded Ray instance and reads /tmp/ray/session_latest: run nothing else with Ray beside it.

A realistic step time (the issue's >= 50 ms/step) on these CPUs:

    .venv/bin/python -m benchmarks.sync_vs_torchrun --rounds 3 --set data.name=synthetic --set model.name=mlp \
        --set model.params=3000000 --set data.synthetic_features=256 --set train.epochs=2
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
from benchmarks.stored import spread
from raydist.observability.metrics import startup_records

REPO = Path(__file__).resolve().parents[1]

SESSION = "/tmp/ray/session_latest"


def run(cmd: list[str], run_dir: Path | None) -> dict:
    """One command: its JSON summary line, plus the first step's and the exit's seconds since launch."""
    launched = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    result = json.loads(lines[-1])
    result["command_s"] = round(time.time() - launched, 2)
    if run_dir is not None:
        result["first_step_s"] = round(startup_records(str(run_dir / "metrics.jsonl"))[0]["first_step"] - launched, 2)
    return result


SIDES = ("ray", "launch", "torchrun")
"""jobs/sync.py on Ray Train (scaling.engine=ray_train, `make run`'s), the same job on scaling.engine=launch, and the
loop under torchrun."""


def one_round(i: int, workers: int, overrides: list[str], tmp: str, sides: tuple[str, ...] = SIDES) -> dict:
    from benchmarks.train_startup_split import split

    py = sys.executable
    common = ["--set", f"scaling.num_workers={workers}", "--set", f"run.storage_path={tmp}"]
    for o in overrides:
        common += ["--set", o]
    runs = {
        "ray": [py, "jobs/sync.py", *common, "--set", f"run.name=ray{i}"],
        "launch": [py, "jobs/sync.py", *common, "--set", "scaling.engine=launch", "--set", f"run.name=launch{i}"],
        "torchrun": [
            py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={workers}",
            "benchmarks/torchrun_sync.py",
            *common,
            "--set",
            f"run.name=torchrun{i}",
        ],
    }
    got = {}
    # Rotate which goes first, so a drift in the machine's load does not favour one side.
    for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
        got[side] = run(runs[side], Path(tmp) / f"{side}{i}")
        if side == "ray":
            got["train_split"] = {k: round(v, 2) for k, v in split(str(Path(SESSION).resolve())).items()}
    again = run(runs["ray"], None)
    ray, tr = got["ray"], got["torchrun"]
    row = {
        "round": i,
        "steps": ray["steps"],
        "ray_first_step_s": ray["first_step_s"],
        "torchrun_first_step_s": tr["first_step_s"],
        "ray_command_s": ray["command_s"],
        "torchrun_command_s": tr["command_s"],
        "ray_loop_steps_per_s": ray["steps_per_s"],
        "torchrun_loop_steps_per_s": tr["steps_per_s"],
        "ray_startup_s": ray.get("startup_s"),
        "ray_train_split_s": got["train_split"],
        # the completed run's own summary again (its wall_s is the first run's), not a second training
        "again_command_s": again["command_s"],
        "again_reported": again["wall_s"] == ray["wall_s"],
    }
    if "launch" in got:
        la = got["launch"]
        row.update(
            {
                "launch_first_step_s": la["first_step_s"],
                "launch_command_s": la["command_s"],
                "launch_loop_steps_per_s": la["steps_per_s"],
                "launch_startup_s": la.get("startup_s"),
            }
        )
    return row


def _ratio(rows: list[dict], a: str, b: str) -> float:
    return round(statistics.median(r[a] / r[b] for r in rows), 2)


def summarize(rows: list[dict]) -> dict:
    out = {
        "first_step_ratio": _ratio(rows, "ray_first_step_s", "torchrun_first_step_s"),
        "command_ratio": _ratio(rows, "ray_command_s", "torchrun_command_s"),
        "loop_ratio": _ratio(rows, "ray_loop_steps_per_s", "torchrun_loop_steps_per_s"),
    }
    if "launch_first_step_s" in rows[0]:
        out.update(
            {
                "launch_first_step_ratio": _ratio(rows, "launch_first_step_s", "torchrun_first_step_s"),
                "launch_command_ratio": _ratio(rows, "launch_command_s", "torchrun_command_s"),
                "launch_loop_ratio": _ratio(rows, "launch_loop_steps_per_s", "torchrun_loop_steps_per_s"),
            }
        )
    return out


def report(stored: dict) -> str:
    """docs/benchmarks.md's tables: the rounds side by side, then where the seconds go (median, min-max)."""
    rows = stored["rounds"]
    out = rounds_table(rows) if "launch_first_step_s" in rows[0] else old_rounds_table(rows)
    loop = [r["ray_loop_steps_per_s"] / r["torchrun_loop_steps_per_s"] for r in rows]
    out += [
        "",
        f"The training loop's own steps/s (set-up excluded), Ray Train over torchrun: {spread(loop, 2)}"
        + (
            f"; launch over torchrun: {spread([r['launch_loop_steps_per_s'] / r['torchrun_loop_steps_per_s'] for r in rows], 2)}."
            if "launch_first_step_s" in rows[0]
            else "."
        ),
    ]
    launch = "launch_startup_s" in rows[0]
    out += [
        "",
        "| seconds since the job's start, until | "
        + ("scaling.engine=ray_train | scaling.engine=launch |" if launch else "s, median (min-max) |"),
        "|---|---|" + ("---|" if launch else ""),
    ]
    for key in ("connect", "workers", "ready", "first_step"):
        cells = [spread([r["ray_startup_s"][key] for r in rows])]
        if launch:
            cells.append(spread([r["launch_startup_s"][key] for r in rows]))
        out.append(f"| `{key}` | " + " | ".join(cells) + " |")
    out += ["", "| Ray Train's step, between `connect` and `workers` | s, median (min-max) |", "|---|---|"]
    for key in rows[0]["ray_train_split_s"]:
        out.append(f"| {key} | {spread([r['ray_train_split_s'][key] for r in rows])} |")
    return "\n".join(out) + "\n"


def rounds_table(rows: list[dict]) -> list[str]:
    """Each round: the first step and the whole command of each side, and each engine's ratio to torchrun."""
    out = [
        "| round | first step: ray_train | launch | torchrun | ratio: ray_train | launch | whole command: "
        "ray_train | launch | torchrun | ratio: ray_train | launch | the completed run again |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = []
        for what in ("first_step_s", "command_s"):
            ray, la, tr = r[f"ray_{what}"], r[f"launch_{what}"], r[f"torchrun_{what}"]
            cells += [f"{ray:.1f} s", f"{la:.1f} s", f"{tr:.1f} s", f"{ray / tr:.2f}", f"{la / tr:.2f}"]
        out.append(f"| {r['round'] + 1} | " + " | ".join(cells) + f" | {r['again_command_s']:.1f} s |")
    s = summarize(rows)
    out.append(
        f"| median | | | | {s['first_step_ratio']:.2f} | {s['launch_first_step_ratio']:.2f} | | | | "
        f"{s['command_ratio']:.2f} | {s['launch_command_ratio']:.2f} | |"
    )
    return out


def old_rounds_table(rows: list[dict]) -> list[str]:
    """Rounds stored before the launch engine: Ray Train and torchrun only."""
    out = [
        "| round | first step: Ray | torchrun | ratio | whole command: Ray | torchrun | ratio | the completed "
        "run again |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['round'] + 1} | {r['ray_first_step_s']:.1f} s | {r['torchrun_first_step_s']:.1f} s | "
            f"{r['ray_first_step_s'] / r['torchrun_first_step_s']:.2f} | {r['ray_command_s']:.1f} s | "
            f"{r['torchrun_command_s']:.1f} s | {r['ray_command_s'] / r['torchrun_command_s']:.2f} | "
            f"{r['again_command_s']:.1f} s |"
        )
    s = summarize(rows)
    out.append(f"| median | | | {s['first_step_ratio']:.2f} | | | {s['command_ratio']:.2f} | |")
    return out


def make_run_line(stored: dict) -> str:
    """README's figure for `make run` (the same command as the Ray side), from the stored rounds."""
    wall = [r["ray_command_s"] for r in stored["rounds"]]
    first = [r["ray_first_step_s"] for r in stored["rounds"]]
    return (
        f"`make run` took {spread(wall)} s after set-up, its first step at {spread(first)} s "
        f"(median and range of {len(wall)} stored rounds on {stored['machine']['cpus']} CPUs)"
    )


def launch_engine_line(stored: dict) -> str:
    """README's figure for the same job on scaling.engine=launch, from the stored rounds."""
    wall = [r["launch_command_s"] for r in stored["rounds"]]
    first = [r["launch_first_step_s"] for r in stored["rounds"]]
    return f"with `--set scaling.engine=launch` it took {spread(wall)} s, its first step at {spread(first)} s"


def main() -> None:
    ap = stored_file.parser(__doc__.splitlines()[0], rounds=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    stored_file.add_options(ap, "docs/data/sync_vs_torchrun.json")
    args = ap.parse_args()
    if stored_file.print_report(
        args.report,
        lambda stored: (
            f"{report(stored)}\n{make_run_line(stored)}\n"
            + (f"{launch_engine_line(stored)}\n" if "launch_command_s" in stored["rounds"][0] else "")
        ),
    ):
        return
    machine_and_commit = stored_file.stamp()  # of the code that runs, before anything is edited beside it
    with tempfile.TemporaryDirectory(prefix="rd-bench-") as tmp:
        rows = []
        for i in range(args.rounds):
            rows.append(one_round(i, args.workers, args.overrides, tmp))
            print(json.dumps(rows[-1]), flush=True)
    stored = {"workers": args.workers, "overrides": args.overrides, "rounds": rows, "summary": summarize(rows)}
    print(json.dumps(stored["summary"]))
    stored_file.save(args.out, stored, machine_and_commit)


if __name__ == "__main__":
    main()
