"""What running jobs/sync.py under raydist costs its training loop: both engines against the same loop under torchrun,
with the CPU everything beside the ranks takes meanwhile.

    .venv/bin/python -m benchmarks.footprint_sync --rounds 3 --out docs/data/footprint_sync.json            # >= 50 ms
    .venv/bin/python -m benchmarks.footprint_sync --rounds 3 --tiny --out docs/data/footprint_sync_tiny.json # make run
    .venv/bin/python -m benchmarks.footprint_sync --rounds 3 --epochs 8 --out docs/data/footprint_sync_long.json
    .venv/bin/python -m benchmarks.footprint_sync --report docs/data/footprint_sync.json

Three sides, the order rotating each round: `jobs/sync.py` on Ray Train (`make run`'s engine, its embedded Ray
instance), the same job with `scaling.engine=launch`, and the same loop (raydist.train.Trainer with SyncDDP) under
`torchrun --standalone` (benchmarks/torchrun_sync.py). By default a step of about 50-60 ms on 2 cores (a 3M-parameter
MLP on 256 synthetic features, two epochs of 250 steps; --epochs for a longer loop, in which the one-time starts
beside it weigh less); with --tiny, `make run`'s own digits job. The loop is read from the run's
metrics.jsonl, which rank 0 writes at every step on all three: its window runs from the first step's record to the
last's, and over it this samples every process's CPU time (/proc) and the machine's busy time, as
benchmarks/footprint.py does for a script of the user's. Reported per engine, over torchrun within a round: the
loop's steps/s (its second half apart), the median step's speed, the whole command's wall time, and the CPU seconds
beside the ranks by process. Run nothing else meanwhile.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.footprint import TICK, cpu_by_pid, name_of, stat_by_pid, used_by_name
from benchmarks.stored import cli, parser, rounds, spread
from benchmarks.suite_time import busy_cpu_s

REPO = Path(__file__).resolve().parents[1]
STEP_50MS = ["data.name=synthetic", "model.name=mlp", "model.params=3000000", "data.synthetic_features=256"]
SIDES = ("ray_train", "launch", "torchrun")
RANKS = {
    "ray_train": ("ray::RayTrainWorker",),
    "launch": ("raydist.engines.process_worker",),
    "torchrun": ("torchrun_sync.py",),
}
"""How each side's training processes are named in the CPU sample (benchmarks.footprint.name_of)."""


def commands(side: str, i: int, overrides: list[str], storage: str) -> list[str]:
    sets = ["scaling.num_workers=2", f"run.storage_path={storage}", f"run.name={side}{i}", *overrides]
    args = [a for s in sets for a in ("--set", s)]
    py = sys.executable
    if side == "torchrun":
        return [
            py,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "benchmarks/torchrun_sync.py",
            *args,
        ]
    engine = ["--set", "scaling.engine=launch"] if side == "launch" else []
    return [py, "jobs/sync.py", *args, *engine]


class Steps:
    """rank 0's step records in a run's metrics.jsonl, read as they are written."""

    def __init__(self, path: Path):
        self.path, self.offset, self.records, self.total = path, 0, [], None

    def read(self) -> None:
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self.offset += len(complete.encode())
        for line in complete.splitlines():
            r = json.loads(line)
            if "session_at_step" in r:
                self.total = r["total_steps"]
            elif "step_time_s" in r:
                self.records.append(r)

    def done(self) -> bool:
        return self.total is not None and bool(self.records) and self.records[-1]["step"] >= self.total


def wait_until(cond, proc: subprocess.Popen, what: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"footprint_sync: error: {proc.args[1]} ended (exit {proc.returncode}) before {what}")
        time.sleep(0.05)


def one(argv: list[str], run_dir: Path, ranks: tuple[str, ...], env: dict[str, str] | None = None) -> dict:
    """One command: its wall time, the loop's figures from metrics.jsonl, the CPU beside the ranks over the loop."""
    steps = Steps(run_dir / "metrics.jsonl")
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: steps.read() or steps.records, proc, "its first step")
        before, busy0, began, kernel0 = cpu_by_pid(), busy_cpu_s(), time.monotonic() - t0, kernel_side(ranks)
        wait_until(lambda: steps.read() or steps.done(), proc, "its last step")
        after, busy1, ended, kernel1 = cpu_by_pid(), busy_cpu_s(), time.monotonic() - t0, kernel_side(ranks)
        code = proc.wait(timeout=600)
        wall = time.monotonic() - t0
        if code != 0:
            log.seek(0)
            raise SystemExit(f"footprint_sync: error: {' '.join(argv[:3])} exited {code}:\n{log.read()[-3000:]}")
    return {
        "command_s": round(wall, 2),
        "before_loop_s": round(began, 2),
        "after_loop_s": round(wall - ended, 2),
        **loop_figures(steps.records),
        **cpu_beside(before, after, busy1 - busy0, ranks),
        **kernel_used(kernel0, kernel1),
    }


def kernel_side(ranks: tuple[str, ...]) -> dict[str, tuple[float, int]]:
    """Each rank process's system CPU seconds and minor page faults so far (/proc/<pid>/stat), by pid."""
    return {
        pid: (int(fields[12]) / TICK, int(fields[7]))
        for pid, fields in stat_by_pid().items()
        if name_of(pid).startswith(ranks)
    }


def kernel_used(before: dict, after: dict) -> dict:
    """The ranks' system CPU and minor page faults between two samples of kernel_side: a loop that returns memory to
    the kernel and takes it back each step shows here, not in the ranks' Python."""
    sys_s = sum(v[0] - before.get(pid, (0.0, 0))[0] for pid, v in after.items())
    faults = sum(v[1] - before.get(pid, (0.0, 0))[1] for pid, v in after.items())
    return {"ranks_sys_s": round(sys_s, 2), "ranks_minor_faults": faults}


def loop_figures(records: list[dict]) -> dict:
    """The loop's steps/s between the first and the last step record, over its second half, and its median step."""
    times = [r["time_s"] for r in records]
    half = len(times) // 2
    return {
        "steps": len(records),
        "steps_per_s": round((len(times) - 1) / (times[-1] - times[0]), 3),
        "late_steps_per_s": round((len(times) - 1 - half) / (times[-1] - times[half]), 3),
        "median_step_s": round(statistics.median(r["step_time_s"] for r in records), 4),
    }


def cpu_beside(before: dict, after: dict, busy: float, ranks: tuple[str, ...]) -> dict:
    by_name = used_by_name(before, after)
    ranks_cpu = sum(v for k, v in by_name.items() if k.startswith(ranks))
    return {
        "machine_busy_s": round(busy, 2),
        "ranks_cpu_s": round(ranks_cpu, 2),
        "beside_ranks_cpu_s": round(busy - ranks_cpu, 2),
        "by_process": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:15]),
    }


def ratios(rounds: list[dict], side: str) -> dict[str, list[float]]:
    def over(key: str, invert: bool = False) -> list[float]:
        return [(r["torchrun"][key] / r[side][key]) if invert else (r[side][key] / r["torchrun"][key]) for r in rounds]

    return {
        "loop": over("steps_per_s"),
        "late_loop": over("late_steps_per_s"),
        "median_step": over("median_step_s", invert=True),
        "command": over("command_s"),
    }


def report(data: dict) -> str:
    rounds = data["rounds"]
    ray, launch = ratios(rounds, "ray_train"), ratios(rounds, "launch")
    beside = {side: [x[side]["beside_ranks_cpu_s"] for x in rounds] for side in SIDES}
    # Both ranks' CPU over the loop per step: how much one command's own processes vary from run to run.
    per_step = {side: [1000 * x[side]["ranks_cpu_s"] / x[side]["steps"] for x in rounds] for side in SIDES}
    step = spread([x["torchrun"]["median_step_s"] * 1000 for x in rounds], 0)
    rows = [
        ("the loop's steps/s", "loop"),
        ("the loop's second half, steps/s", "late_loop"),
        ("the median step's speed", "median_step"),
        ("the whole command's wall time", "command"),
    ]
    return (
        "\n".join(
            [
                f"`jobs/sync.py` on each engine against the same loop under `torchrun --standalone`, {len(rounds)} rounds "
                f"rotating the order on {data['machine']['cpus']} CPUs (median (min-max); {data['commit'][:7]}, "
                f"{data['date']}; {rounds[0]['torchrun']['steps']} steps of {step} ms under torchrun; "
                f"`{' '.join(data['overrides']) or 'make run'}`):",
                "",
                "| | Ray Train engine / torchrun | launch engine / torchrun |",
                "|---|---|---|",
                *(f"| {label} | {spread(ray[key], 2)}x | {spread(launch[key], 2)}x |" for label, key in rows),
                f"| the ranks' own CPU per step (ms) | {spread(per_step['ray_train'], 0)} | "
                f"{spread(per_step['launch'], 0)} (torchrun: {spread(per_step['torchrun'], 0)}) |",
                f"| CPU seconds beside the ranks over the loop | {spread(beside['ray_train'])} s | "
                f"{spread(beside['launch'])} s (torchrun: {spread(beside['torchrun'])} s) |",
            ]
        )
        + "\n"
    )


def measure(args) -> dict:
    overrides = [] if args.tiny else [*STEP_50MS, f"train.epochs={args.epochs}"]

    def one_round(storage: str, i: int) -> dict:
        order = SIDES[i % 3 :] + SIDES[: i % 3]
        return {s: one(commands(s, i, overrides, storage), Path(storage) / f"{s}{i}", RANKS[s]) for s in order}

    return {"overrides": overrides, "rounds": rounds(args.rounds, "rd-footprint-sync-", one_round)}


def main() -> int:
    ap = parser(__doc__, rounds=3)
    ap.add_argument("--tiny", action="store_true", help="make run's digits job instead of a >= 50 ms step")
    ap.add_argument("--epochs", type=int, default=2, help="the >= 50 ms step's epochs of 250 steps (default 2)")
    cli(ap, "docs/data/footprint_sync.json", report, measure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
