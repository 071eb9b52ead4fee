"""SIGKILL parameter-server shards and Downpour workers during one async run; it must end as an undisturbed run does.

    .venv/bin/python -m benchmarks.ps_chaos [--server-kills 3] [--worker-kills 3] [--seed 0] [--set KEY=VALUE]...
    .venv/bin/python -m benchmarks.ps_chaos --out docs/data/ps_chaos.json      # stored, as docs/faults.md quotes
    .venv/bin/python -m benchmarks.ps_chaos --report docs/data/ps_chaos.json   # docs/faults.md's tables

Runs the async job (`python -m raydist.job async`, on its own embedded Ray instance) twice with the same config,
CONFIG below plus any --set: once undisturbed, then once while this script SIGKILLs actor processes, servers and
workers in turn, each a random one of the processes Ray titled `ray::ParameterShard` or `ray::DownpourWorker` among
the job's descendants. Before each kill it waits until the run has checkpointed past the point it last restarted
from (so it makes progress between kills), then a random 0 to 0.5 s more (so kills land anywhere between two
checkpoints); after each kill, until the job prints its restart line and training goes on.

Prints, per kill: the actor the job named, the step reached at the kill, the checkpoint step it went back to (the
difference is recomputed), the seconds until the job noticed (restart line) and until training went on (new
metrics records); then both runs' summaries side by side. tests/test_ps_faults.py runs a short version (one kill of
each) with the same functions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import stored as stored_file
from tests.support.jobutil import clean_env, job_processes_titled

REPO = Path(__file__).resolve().parents[1]

# 2 shards and 2 workers, 2000 steps (6-8 s of training on 2 cores: time for six kills). The synthetic data's 4000
# test samples make the final test accuracy of undisturbed async runs agree within 0.002 (digits' 360 vary by 0.011
# after 40 epochs, more than the 0.01 the comparison allows).
CONFIG = [
    "data.name=synthetic",
    "train.epochs=4",
    "async_ps.num_servers=2",
    "scaling.num_workers=2",
    "checkpoint.every_steps=50",
]
KILL_SPREAD_S = 0.5  # a little more than 50 steps take here
TITLES = {"server": "ray::ParameterShard", "worker": "ray::DownpourWorker"}
RESTART = re.compile(
    r"^\[raydist\] async: (?P<who>.+?) (?:died|stopped answering) \((?P<why>.*)\) on node (?P<node>\S+) at step (?P<at>\d+); "
    r"restarting servers and workers from (?:checkpoint step (?P<step>\d+)|the initial parameters) "
    r"\(failure (?P<n>\d+)",
    re.M,
)
POLL_S = 0.05
WAIT_S = 300  # generous: the machines this runs on are often shared and slow; a hang still ends


class Job:
    """One async job in a subprocess, its output in files next to its run directory."""

    def __init__(self, storage: Path, name: str, overrides: list[str]):
        self.run_dir = storage / name
        self.out, self.err = storage / f"{name}.out", storage / f"{name}.err"
        args = [
            sys.executable,
            "-m",
            "raydist.job",
            "async",
            "--set",
            f"run.storage_path={storage}",
            "--set",
            f"run.name={name}",
        ]
        for o in overrides:
            args += ["--set", o]
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(args, cwd=REPO, env=clean_env(), stdout=out, stderr=err, text=True)

    def titled(self, role: str) -> list[int]:
        """The job's processes Ray titled for `role` (TITLES): under the job itself (its embedded instance), or
        under the shared head a test runs it on (those started since the job: an earlier job's may still be
        ending)."""
        return job_processes_titled(self.proc, TITLES[role])

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def records(self) -> int:
        """Lines in metrics.jsonl: grows while training goes on."""
        try:
            with open(self.run_dir / "metrics.jsonl", "rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def newest_checkpoint(self) -> int:
        steps = [int(p.name.removeprefix("checkpoint_step")) for p in self.run_dir.glob("checkpoint_step*")]
        return max(steps, default=-1)

    def restarts(self) -> list[re.Match]:
        return list(RESTART.finditer(self.stdout()))

    def wait_until(self, what: str, check, timeout: float = WAIT_S):
        """check()'s first truthy value; fails if the job ends first or nothing comes within `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the job ended (exit {self.proc.returncode}) while waiting for {what}:\n"
                    f"{self.stdout()[-2000:]}\n{self.stderr()[-2000:]}"
                )
            time.sleep(POLL_S)
        self.stop()
        raise RuntimeError(f"no {what} within {timeout} s:\n{self.stdout()[-2000:]}")

    def finish(self, timeout: float = 900) -> tuple[int, dict | None]:
        """Its exit status and summary.json (None when it failed)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        summary = self.run_dir / "summary.json"
        return code, json.loads(summary.read_text()) if code == 0 and summary.exists() else None

    def stop(self) -> None:
        """End the job (its driver tears its Ray instance down on SIGTERM)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def tracebacks(output: str) -> list[str]:
    """Lines that start a traceback or a Ray 'Unhandled error' report: a restart should print neither."""
    return [ln for ln in output.splitlines() if "Traceback (most recent call last)" in ln or "Unhandled error" in ln]


@dataclass
class Kill:
    role: str  # what was killed: server or worker
    named: str  # what the job said died
    at_step: int  # the step the job had reached when it noticed
    from_step: int  # the checkpoint step the job restarted from; at_step - from_step steps are computed again
    noticed_s: float  # from the kill to the job's restart line
    resumed_s: float  # from the kill to the first metrics record after the restart


def chaos(job: Job, plan: list[str], seed: int = 0, min_records: int = 20) -> list[Kill]:
    """SIGKILL one actor of each role in `plan` in turn, each once the run has logged `min_records` records since it
    (re)started and checkpointed past its last restart point, and then up to KILL_SPREAD_S later (so that kills land
    anywhere between two checkpoints)."""
    rng = random.Random(seed)
    kills: list[Kill] = []
    restarted_from, records_at_start, gone = 0, 0, set()
    for role in plan:
        job.wait_until(
            "a checkpoint past the restart point and progress",
            lambda: job.newest_checkpoint() > restarted_from and job.records() >= records_at_start + min_records,
        )
        time.sleep(rng.uniform(0, KILL_SPREAD_S))
        # The actors of this start; those of the last one may linger for a moment after the driver killed them.
        pids = job.wait_until(
            f"the {role}s of this start", lambda: [p for p in job.titled(role) if p not in gone] or None
        )
        gone |= {p for r in TITLES for p in job.titled(r)}
        seen = len(job.restarts())
        killed = time.monotonic()
        os.kill(rng.choice(pids), signal.SIGKILL)
        line = job.wait_until("the restart line", lambda: job.restarts()[seen] if len(job.restarts()) > seen else None)
        noticed = time.monotonic()
        records_at_start = job.records()
        job.wait_until("training after the restart", lambda: job.records() > records_at_start)
        restarted_from = int(line["step"] or 0)
        kills.append(
            Kill(
                role,
                line["who"],
                int(line["at"]),
                restarted_from,
                round(noticed - killed, 2),
                round(time.monotonic() - killed, 2),
            )
        )
    return kills


def report(stored: dict) -> str:
    """docs/faults.md's two tables: each kill, then both runs side by side."""
    out = [
        "| kill | the job named | at step | back to checkpoint | recomputed | noticed (s) | training again (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    out += [
        f"| {k['role']} | {k['named']} | {k['at_step']} | {k['from_step']} | {k['at_step'] - k['from_step']} | "
        f"{k['noticed_s']:.2f} | {k['resumed_s']:.2f} |"
        for k in stored["kills"]
    ]
    calm, hit = stored["undisturbed"], stored["chaos"]
    out += ["", f"| | undisturbed | {len(stored['kills'])} kills |", "|---|---|---|"]
    rows = [
        ("status", "{status}"),
        ("steps / total_steps", "{steps} / {total_steps}"),
        ("restarts", "{restarts}"),
        ("test accuracy", "{test_accuracy:.4f}"),
        ("test loss", "{test_loss:.4f}"),
        ("train_time_s", "{train_time_s:.1f}"),
        ("wall_s", "{wall_s:.1f}"),
    ]
    out += [f"| {name} | {fmt.format(**calm)} | {fmt.format(**hit)} |" for name, fmt in rows]
    out += ["", f"Tracebacks in the job's output: {stored['tracebacks']}."]
    return "\n".join(out) + "\n"


def run_both(plan: list[str], overrides: list[str], seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="ps_chaos-") as tmp:
        storage = Path(tmp)
        base = Job(storage, "undisturbed", overrides)
        code, undisturbed = base.finish()
        if undisturbed is None:
            sys.exit(f"the undisturbed run failed (exit {code}):\n{base.stderr()[-2000:]}")
        job = Job(storage, "chaos", overrides)
        try:
            kills = chaos(job, plan, seed)
        except BaseException:
            job.stop()
            raise
        code, disturbed = job.finish()
        if disturbed is None:
            sys.exit(f"the run under chaos failed (exit {code}):\n{job.stderr()[-2000:]}")
        noise = tracebacks(job.stdout() + job.stderr())
    ok = (
        disturbed["status"] == "completed"
        and disturbed["steps"] == disturbed["total_steps"]
        and not noise
        and disturbed["restarts"] == len(plan)
        and abs(disturbed["test_accuracy"] - undisturbed["test_accuracy"]) <= 0.01
    )
    return {
        "config": overrides,
        "seed": seed,
        "kills": [asdict(k) for k in kills],
        "undisturbed": undisturbed,
        "chaos": disturbed,
        "tracebacks": len(noise),
        "first_tracebacks": noise[:3],
        "ok": ok,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-kills", type=int, default=3)
    ap.add_argument("--worker-kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")
    stored_file.add_options(ap, "docs/data/ps_chaos.json")
    args = ap.parse_args()
    if stored_file.print_report(args.report, report):
        return
    machine_and_commit = stored_file.stamp()
    plan = [
        role
        for i in range(max(args.server_kills, args.worker_kills))
        for role, n in (("server", args.server_kills), ("worker", args.worker_kills))
        if i < n
    ]
    stored = run_both(plan, [*CONFIG, f"scaling.max_failures={len(plan)}", *args.overrides], args.seed)
    print(report(stored), *stored["first_tracebacks"], sep="\n")
    stored_file.save(args.out, stored, machine_and_commit)
    sys.exit(0 if stored["ok"] else 1)


if __name__ == "__main__":
    main()
