"""What running under raydist costs a long job: the training loop and the whole command against torchrun, and the
CPU that everything beside the ranks takes meanwhile.

    .venv/bin/python -m benchmarks.footprint --rounds 3 --out docs/data/footprint.json
    .venv/bin/python -m benchmarks.footprint --report docs/data/footprint.json

Each round, in alternating order, the same script (benchmarks/footprint_ddp.py: a ~4M-parameter MLP, batch 256,
gloo, a step of about 0.1 s on 2 cores) under `torchrun --standalone --nproc-per-node 2` and under
`raydist launch --workers 2` (its embedded Ray instance). The script times its own loop (after warm-up steps) and
marks its start and end; over that window this samples every process's CPU time (/proc) and the machine's busy
time, so that the CPU used beside the two ranks (Ray's daemons, raydist's actors and loop, the launcher) is counted
by process, whoever started it. Reported per side: the loop's steps/s, its median step, the whole command's wall
time, and the CPU seconds beside the ranks; the ratios are launch over torchrun within a round (higher steps/s is
better: a ratio of 0.97 means 3% slower). The loop's second half is reported apart (what a long run's steady state
is, after the one-time starts), and each round also times a short run (--short-steps) of both commands whole.
Run nothing else meanwhile: the machine's busy time counts everything.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.stored import add_options, parser, print_report, save, spread, stamp
from benchmarks.suite_time import busy_cpu_s

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCRIPT = REPO / "benchmarks" / "footprint_ddp.py"
TICK = os.sysconf("SC_CLK_TCK")


def commands(out: Path, steps: int) -> dict[str, list[str]]:
    script = [str(SCRIPT), "--steps", str(steps), "--out", str(out)]
    return {
        "torchrun": [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *script],
        "launch": [str(BIN / "raydist"), "launch", "--workers", "2", "--", sys.executable, *script],
    }


def name_of(pid: str) -> str:
    """How a process is counted: Ray's process titles (ray::StandIn, ray-dashboard-...), the script a Python
    process runs, or the executable's name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    if not words:
        return "?"
    first = words[0]
    if first.startswith(("ray::", "ray-dashboard")):
        return first.split()[0][:40]
    if "footprint_ddp.py" in " ".join(words):
        return "the ranks (footprint_ddp.py)" if "python" in Path(first).name else Path(first).name
    script = next((w for w in words[1:] if w.endswith(".py") or w.startswith("raydist")), None)
    if "-m" in words[1:]:
        script = words[words.index("-m") + 1]
    return Path(script).name if script else Path(first).name


def stat_by_pid() -> dict[str, list[str]]:
    """Every process's /proc/<pid>/stat fields after its command name (utime is [11], stime [12], minflt [7])."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            found[entry.name] = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
    return found


def cpu_by_pid() -> dict[str, tuple[str, float]]:
    return {pid: (name_of(pid), (int(fields[11]) + int(fields[12])) / TICK) for pid, fields in stat_by_pid().items()}


def used_by_name(before: dict, after: dict) -> dict[str, float]:
    """The CPU seconds each kind of process (name_of) used between two samples of cpu_by_pid; this one left out."""
    by_name: dict[str, float] = {}
    for pid, (name, cpu) in after.items():
        used = cpu - before.get(pid, (name, 0.0))[1]
        if used > 0 and pid != str(os.getpid()):
            by_name[name] = round(by_name.get(name, 0.0) + used, 2)
    return by_name


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"footprint: error: {proc.args[0]} ended (exit {proc.returncode}) before {path.name}")
        time.sleep(0.05)


def one(argv: list[str], out: Path) -> dict:
    """One command: its wall time, the loop's figures from the script, and the CPU beside the ranks over the loop."""
    for p in (out, Path(f"{out}.start"), Path(f"{out}.end")):
        p.unlink(missing_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait_for(Path(f"{out}.start"), proc)
        before, busy0, began = cpu_by_pid(), busy_cpu_s(), time.monotonic() - t0
        wait_for(Path(f"{out}.end"), proc)
        after, busy1, ended = cpu_by_pid(), busy_cpu_s(), time.monotonic() - t0
        code = proc.wait(timeout=600)
        wall = time.monotonic() - t0
        if code != 0 or not out.exists():
            log.seek(0)
            raise SystemExit(f"footprint: error: {' '.join(argv[:4])} exited {code}:\n{log.read()[-3000:]}")
    result = json.loads(out.read_text())
    by_name = used_by_name(before, after)
    ranks = sum(result["ranks_cpu_s"])
    steps = result["step_s"]
    return {
        "command_s": round(wall, 2),
        "before_loop_s": round(began, 2),
        "after_loop_s": round(wall - ended, 2),
        "loop_s": round(result["loop_s"], 3),
        "steps_per_s": round(len(steps) / result["loop_s"], 3),
        # The loop's second half: after the one-time starts (the dashboard's actors register in the first seconds).
        "late_steps_per_s": round((len(steps) - len(steps) // 2) / sum(steps[len(steps) // 2 :]), 3),
        "median_step_s": round(statistics.median(steps), 4),
        "p95_step_s": round(sorted(steps)[int(0.95 * len(steps))], 4),
        "machine_busy_s": round(busy1 - busy0, 2),
        "ranks_cpu_s": round(ranks, 2),
        "beside_ranks_cpu_s": round(busy1 - busy0 - ranks, 2),
        "by_process": dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:15]),
    }


def short(argv: list[str]) -> float:
    """The whole command's wall time for a short run of the script (no sampling)."""
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"footprint: error: {' '.join(argv[:4])} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return round(time.monotonic() - t0, 2)


def ratios(rounds: list[dict]) -> dict[str, list[float]]:
    return {
        "loop": [r["launch"]["steps_per_s"] / r["torchrun"]["steps_per_s"] for r in rounds],
        "late_loop": [
            r["launch"]["late_steps_per_s"] / r["torchrun"]["late_steps_per_s"]
            for r in rounds
            if "late_steps_per_s" in r["launch"]
        ],
        "short_command": [
            r["launch"]["short_command_s"] / r["torchrun"]["short_command_s"]
            for r in rounds
            if "short_command_s" in r["launch"]
        ],
        "median_step": [r["torchrun"]["median_step_s"] / r["launch"]["median_step_s"] for r in rounds],
        "command": [r["launch"]["command_s"] / r["torchrun"]["command_s"] for r in rounds],
    }


def report(data: dict) -> str:
    rounds, r = data["rounds"], ratios(data["rounds"])
    beside = {side: [x[side]["beside_ranks_cpu_s"] for x in rounds] for side in ("torchrun", "launch")}
    loops = [x["torchrun"]["loop_s"] for x in rounds]
    before, after = (
        {side: [x[side].get(key, float("nan")) for x in rounds] for side in ("torchrun", "launch")}
        for key in ("before_loop_s", "after_loop_s")
    )
    return (
        "\n".join(
            [
                f"`raydist launch --workers 2` against `torchrun --standalone`, the same script, {len(rounds)} rounds "
                f"in alternating order on {data['machine']['cpus']} CPUs (median (min-max); {data['commit'][:7]}, "
                f"{data['date']}; a loop of {data['steps']} steps, {spread(loops)} s under torchrun):",
                "",
                "| | raydist launch / torchrun |",
                "|---|---|",
                f"| the loop's steps/s | {spread(r['loop'], 2)}x |",
                *([f"| the loop's second half, steps/s | {spread(r['late_loop'], 2)}x |"] if r["late_loop"] else []),
                f"| the median step's speed | {spread(r['median_step'], 2)}x |",
                f"| the whole command's wall time | {spread(r['command'], 2)}x |",
                *(
                    [
                        f"| a short run's whole command ({data['short_steps']} steps; "
                        f"{spread([x['torchrun']['short_command_s'] for x in rounds])} s under torchrun) | "
                        f"{spread(r['short_command'], 2)}x |"
                    ]
                    if r["short_command"]
                    else []
                ),
                f"| before the loop, after it (s) | {spread(before['launch'])} and {spread(after['launch'])} against "
                f"{spread(before['torchrun'])} and {spread(after['torchrun'])} |",
                f"| CPU seconds beside the ranks over the loop | {spread(beside['launch'])} s against "
                f"{spread(beside['torchrun'])} s |",
            ]
        )
        + "\n"
    )


def main() -> int:
    ap = parser(__doc__, rounds=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--short-steps", type=int, default=15, help="the short run's steps (0: none)")
    add_options(ap, "docs/data/footprint.json")
    args = ap.parse_args()
    if print_report(args.report, report):
        return 0
    stamped, data = stamp(), {"steps": args.steps, "short_steps": args.short_steps, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="rd-footprint-") as tmp:
        cmds = commands(Path(tmp) / "fp.json", args.steps)
        shorts = commands(Path(tmp) / "short.json", args.short_steps)
        for i in range(args.rounds):
            order = ["torchrun", "launch"] if i % 2 == 0 else ["launch", "torchrun"]
            data["rounds"].append({side: one(cmds[side], Path(tmp) / "fp.json") for side in order})
            for side in order if args.short_steps else ():
                data["rounds"][-1][side]["short_command_s"] = short(shorts[side])
            print(json.dumps(data["rounds"][-1]), flush=True)
    save(args.out, data, stamped)
    print(report({**data, **stamped}), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
