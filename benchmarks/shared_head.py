"""What a short job costs on its own embedded Ray instance against the same job on a running Ray head: the reason
the tests marked `shared_ray` share one head (docs/dev/testing.md).

    .venv/bin/python -m benchmarks.shared_head --rounds 3 --out docs/data/shared_head.json
    .venv/bin/python -m benchmarks.shared_head --report docs/data/shared_head.json   # docs/dev/testing.md's line

Starts two heads (tests/support/rayhead.py: `ray start --head`, token auth, loopback), one with a warm interpreter that
forks the jobs' Ray workers, as the tests' head has (`head`), one without (`cold head`), and then, per round, runs
`jobs/sync.py` for one epoch on each head and on an embedded instance of its own, rotating which goes first. Per
run: the command's wall time and the CPU time the whole machine spent meanwhile (/proc/stat: every process, Ray's
daemons included, which a per-process count would miss as they come and go). Run it on an otherwise idle machine:
the CPU count is the machine's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import stored as stored_file
from benchmarks.stored import busy_cpu_s, spread
from tests.support.jobutil import clean_env
from tests.support.rayhead import ray_head

REPO = Path(__file__).resolve().parents[1]

JOB = ["--set", "train.epochs=1", "--set", "run.tensorboard=false"]


def one_run(storage: str, name: str, env: dict[str, str]) -> dict:
    cpu, t = busy_cpu_s(), time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "jobs/sync.py", "--set", f"run.storage_path={storage}", "--set", f"run.name={name}", *JOB],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    wall, cpu = time.perf_counter() - t, busy_cpu_s() - cpu
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((Path(storage) / name / "summary.json").read_text())
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "first_step_s": summary["startup_s"]["first_step"]}


SIDES = ("embedded", "head", "cold head")


def report(stored: dict) -> str:
    runs = stored["rounds"]
    lines = []
    for where in (w for w in SIDES if w in runs[0]):
        lines.append(
            f"{where}: whole command {spread([r[where]['wall_s'] for r in runs])} s, machine CPU "
            f"{spread([r[where]['cpu_s'] for r in runs])} s, first step {spread([r[where]['first_step_s'] for r in runs])} s"
        )
    ratio = [r["head"]["cpu_s"] / r["embedded"]["cpu_s"] for r in runs]
    wall = [r["head"]["wall_s"] / r["embedded"]["wall_s"] for r in runs]
    lines.append(
        f"on the head, per round: {spread(ratio, 2)} of the CPU time, {spread(wall, 2)} of the wall time "
        f"({len(runs)} rounds, {stored['machine'].get('cpus', '?')} CPUs, {stored['date']}, "
        f"commit {stored['commit'][:7]})"
    )
    if "cold head" in runs[0]:
        ratio = [r["head"]["cpu_s"] / r["cold head"]["cpu_s"] for r in runs]
        wall = [r["head"]["wall_s"] / r["cold head"]["wall_s"] for r in runs]
        lines.append(
            f"on the head with its warm interpreter, per round: {spread(ratio, 2)} of the cold head's CPU "
            f"time, {spread(wall, 2)} of its wall time"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=3)
    stored_file.add_options(ap, "docs/data/shared_head.json")
    args = ap.parse_args()
    if stored_file.print_report(args.report, report):
        return
    stamped = stored_file.stamp()
    with ray_head(num_cpus=8) as head, ray_head(num_cpus=8, warm=False) as cold:
        envs = {"head": clean_env(**head.job_env()), "cold head": clean_env(**cold.job_env()), "embedded": clean_env()}

        def one_round(storage: str, i: int) -> dict:
            order = list(SIDES[i % 3 :] + SIDES[: i % 3])
            done = {where: one_run(storage, f"{where.replace(' ', '-')}{i}", envs[where]) for where in order}
            print(json.dumps({"round": i, **done}), flush=True)
            return done

        # A head's first job starts its detached actors (Ray Train's state actor, the autoscaling coordinator),
        # which later jobs reuse: not counted, as only the first of a test session's jobs pays it.
        for h in (head, cold):
            one_run(str(Path(h.temp_dir) / "warm"), "warm", clean_env(**h.job_env()))
        runs = stored_file.rounds(args.rounds, "rd-shared-head-", one_round)
    stored = {"job": JOB, "rounds": runs}
    print(report({**stored, **stamped}), end="")
    stored_file.save(args.out, stored, stamped)


if __name__ == "__main__":
    main()
