"""Where the training loop's gap to torchrun comes from: one suspect at a time, the same loop with and without it.

    .venv/bin/python -m benchmarks.footprint_ab --case thread --rounds 4 --out docs/data/footprint_ab_thread.json
    .venv/bin/python -m benchmarks.footprint_ab --case warm --rounds 4 --out docs/data/footprint_ab_warm.json
    .venv/bin/python -m benchmarks.footprint_ab --report docs/data/footprint_ab_thread.json

benchmarks/footprint_sync.py measures `jobs/sync.py` on each engine against torchrun (a step of about 50 ms on 2
cores). Each case here runs one of its sides twice, as it is (A) and with one thing changed (B), in alternating
order, and reports B over A within a round: the loop's steps/s (from rank 0's metrics.jsonl, as there), the median
step's speed, and the CPU the ranks' own processes spent per step, with its system part and their minor page faults
per step (what the kernel does for them: gloo's sockets, memory returned and taken back).

- thread: the torchrun side with its loop in the main thread (A) and in a second thread of the same process (B),
  as Ray Train runs `train_loop_per_worker`.
- warm: the Ray Train side with its workers forked from the warm interpreter (A, the default) and started as fresh
  Pythons by Ray (B, `scaling.warm_python=false`).
- prestart: the launch engine as it is (A) and with the embedded raylet told to start no idle Ray workers ahead of
  need (B, `RAY_prestart_worker_first_driver=0`, `RAY_enable_worker_prestart=0`).
- arena: the torchrun side with its loop in a second thread (A, as `thread`'s B) and the same with glibc's malloc
  keeping one arena for every thread (B, `MALLOC_ARENA_MAX=1`), as the main thread has.
- runlist: the launch engine as it is (A) and with the dashboard's run list turned off (B,
  `RAY_TRAIN_ENABLE_STATE_TRACKING=0`): no stand-in actor per rank, no Ray Train state actor, none of Ray Train's
  modules imported by the driver to register the run.
- helpers: the Ray Train side as it is (A) and with Ray Train's controller and helper actors (the synchronization
  actor, the autoscaling coordinator) at niceness 19 (B), set by this benchmark as they appear (root).

Run nothing else meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.footprint_sync import RANKS, STEP_50MS, commands, one
from benchmarks.stored import cli, parser, rounds, spread


@dataclass(frozen=True)
class Case:
    side: str
    """footprint_sync's side that both variants run."""
    change: str
    """What B changes, as the report says it."""
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    a_args: list[str] = field(default_factory=list)
    """What A adds to the side's command (B adds `args` instead)."""
    a: str = "as it is"
    """A, as the report says it."""
    renice: tuple[str, ...] = ()
    """Process titles this benchmark sets to niceness 19 while B runs."""


CASES = {
    "thread": Case("torchrun", "the loop in a second thread", args=["--in-thread"]),
    "arena": Case(
        "torchrun",
        "one malloc arena for every thread",
        args=["--in-thread"],
        env={"MALLOC_ARENA_MAX": "1"},
        a_args=["--in-thread"],
        a="with its loop in a second thread",
    ),
    "warm": Case("ray_train", "workers started fresh by Ray", args=["--set", "scaling.warm_python=false"]),
    "prestart": Case(
        "launch",
        "no idle Ray workers started ahead of need",
        env={"RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"},
    ),
    "runlist": Case(
        "launch",
        "the dashboard's run list turned off",
        env={"RAY_TRAIN_ENABLE_STATE_TRACKING": "0"},
    ),
    "helpers": Case(
        "ray_train",
        "Ray Train's controller and helper actors at niceness 19",
        renice=("ray::TrainController", "ray::SynchronizationActor", "ray::_AutoscalingCoordinatorActor"),
    ),
}


@contextlib.contextmanager
def renicing(titles: tuple[str, ...]):
    """While inside: the first process whose command line starts with each of `titles`, at niceness 19 (looked for
    every 0.5 s until each is found: the scan's own CPU then stops)."""
    stop, done = threading.Event(), {}

    def scan() -> None:
        while len(done) < len(titles) and not stop.wait(0.5):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
                    title = next((t for t in titles if argv.startswith(t) and t not in done), None)
                    if title:
                        os.setpriority(os.PRIO_PROCESS, int(pid), 19)
                        done[title] = int(pid)
                except OSError:
                    continue

    thread = threading.Thread(target=scan, daemon=True)
    if titles:
        thread.start()
    try:
        yield done
    finally:
        stop.set()
        if titles:
            thread.join()


def variant(case: Case, b: bool, i: int, storage: str) -> dict:
    name = f"{'b' if b else 'a'}{i}"
    argv = commands(case.side, i, [*STEP_50MS, "train.epochs=2"], storage)
    argv = [a.replace(f"run.name={case.side}{i}", f"run.name={name}") for a in argv]
    argv += case.args if b else case.a_args
    env = {**os.environ, **(case.env if b else {})}
    with renicing(case.renice if b else ()) as reniced:
        got = one(argv, Path(storage) / name, RANKS[case.side], env)
    if case.renice and b:
        got["reniced"] = sorted(reniced)
    per_step = 1 / max(got["steps"] - 1, 1)
    got["ranks_cpu_ms_per_step"] = round(1000 * got["ranks_cpu_s"] * per_step, 1)
    got["ranks_sys_ms_per_step"] = round(1000 * got["ranks_sys_s"] * per_step, 1)
    got["ranks_faults_per_step"] = round(got["ranks_minor_faults"] * per_step)
    return got


def report(data: dict) -> str:
    rounds = data["rounds"]

    def over(key: str, invert: bool = False) -> list[float]:
        return [(r["a"][key] / r["b"][key]) if invert else (r["b"][key] / r["a"][key]) for r in rounds]

    case = CASES[data["case"]]
    return (
        "\n".join(
            [
                f"`{data['case']}`: footprint_sync's {case.side} side {case.a} (A) and with {case.change} (B), "
                f"{len(rounds)} rounds alternating on {data['machine']['cpus']} CPUs (median (min-max); "
                f"{data['commit'][:7]}, {data['date']}):",
                "",
                "| | B / A |",
                "|---|---|",
                f"| the loop's steps/s | {spread(over('steps_per_s'), 2)}x |",
                f"| the median step's speed | {spread(over('median_step_s', invert=True), 2)}x |",
                f"| the ranks' CPU per step | {spread(over('ranks_cpu_ms_per_step'), 2)}x |",
                *kernel_rows(rounds),
                f"| CPU seconds beside the ranks over the loop, A and B | "
                f"{spread([r['a']['beside_ranks_cpu_s'] for r in rounds])} s and "
                f"{spread([r['b']['beside_ranks_cpu_s'] for r in rounds])} s |",
            ]
        )
        + "\n"
    )


def kernel_rows(rounds: list[dict]) -> list[str]:
    """The ranks' system CPU and minor page faults per step, A and B (files stored before they were counted: none)."""
    if "ranks_sys_ms_per_step" not in rounds[0]["a"]:
        return []

    def both(key: str, digits: int) -> str:
        return " and ".join(f"{spread([r[v][key] for r in rounds], digits)}" for v in ("a", "b"))

    return [
        f"| the ranks' system CPU per step, A and B | {both('ranks_sys_ms_per_step', 1)} ms |",
        f"| the ranks' minor page faults per step, A and B | {both('ranks_faults_per_step', 0)} |",
    ]


def measure(args) -> dict:
    case = CASES[args.case]

    def one_round(storage: str, i: int) -> dict:
        order = (False, True) if i % 2 == 0 else (True, False)
        return {("b" if b else "a"): variant(case, b, i, storage) for b in order}

    return {"case": args.case, "rounds": rounds(args.rounds, "rd-footprint-ab-", one_round)}


def main() -> int:
    ap = parser(__doc__, rounds=4)
    ap.add_argument("--case", choices=sorted(CASES), default="thread")
    cli(ap, "docs/data/footprint_ab_<case>.json", report, measure)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
