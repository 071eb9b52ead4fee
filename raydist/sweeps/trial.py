"""One trial of a sweep, run inside Ray Tune's trial actor: the strategy's own job, as a user runs it, on the
trial's config, joined to the sweep's Ray cluster; its evaluations passed to Tune as they land in metrics.jsonl.

The job runs as a child process (`python -m raydist.job <strategy> --config <trial>.yaml`), not in the actor: it is
then exactly the job a user runs (its signals, its exit, its resume from its own run directory when the sweep is
restored). When Tune stops the trial (ASHA), it ends the trial's actor some seconds later, and Ray ends the
actor's child processes with it (SIGTERM): the job's driver dies, and its Ray Train run with it. Its checkpoints
stay; a stopped trial is not resumed. Should the actor die otherwise, PR_SET_PDEATHSIG interrupts the job.

At the cluster's stop request (SLURM's time-limit warning: raydist.cluster.preemption) the trial's job checkpoints
and stops like any run on the cluster, and the trial ends unfinished (`Stopped`), as does every trial that would
start after it: the sweep ends, and the same command, in the requeued allocation, restores it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from raydist.observability.metrics import METRICS_FILE
from raydist.summary import RESULT_ENV, SUMMARY_FILE
from raydist.sweeps.space import overrides

STOPPED = "unfinished at the cluster's stop request"


class Stopped(RuntimeError):
    """The cluster asked every run to checkpoint and stop (SLURM's time-limit warning, a preemption): the trial ends
    unfinished, as an errored trial, which the restored sweep (`resume_errored`) runs again; its job resumes from
    its own checkpoint. Its message ends with STOPPED, which the results read."""


POLL_S = 0.5
STOP_GRACE_S = 60.0  # a stopped trial's job ends its Ray Train run before it exits; then it is killed
PR_SET_PDEATHSIG = 1


def trial_config(base: dict[str, Any], values: dict[str, Any], trials_dir: Path, trial_id: str) -> dict[str, Any]:
    """The trial's whole config: the sweep's base, the trial's values, its own run directory under trials_dir."""
    cfg = deep_update(base, overrides(values))
    return deep_update(cfg, {"run": {"storage_path": str(trials_dir), "name": trial_id}})


def deep_update(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in new.items():
        out[k] = deep_update(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def evaluation_reports(lines: list[str], last_loss: float | None) -> tuple[list[dict[str, Any]], float | None]:
    """What Tune gets from new metrics.jsonl lines: one report per evaluation (step, test_accuracy, test_loss, and
    the latest step's loss), and the latest loss seen."""
    reports = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "step" in r and isinstance(r.get("loss"), (int, float)):
            last_loss = float(r["loss"])
        elif "eval_at_step" in r:
            reports.append(
                {
                    "step": int(r["eval_at_step"]),
                    "test_accuracy": r.get("test_accuracy"),
                    "test_loss": r.get("test_loss"),
                    "loss": last_loss,
                }
            )
    return reports, last_loss


class Tail:
    """New whole lines of a file that another process appends to."""

    def __init__(self, path: Path):
        self.path, self.offset, self.rest = path, 0, ""

    def skip_to_end(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        *whole, self.rest = (self.rest + text).split("\n")
        return [ln for ln in whole if ln.strip()]


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGINT)


def run_trial(
    values: dict[str, Any],
    *,
    strategy: str,
    base: dict[str, Any],
    trials_dir: str,
    address: str,
    cwd: str,
    pythonpath: str,
) -> None:
    """Ray Tune's function trainable (bound with functools.partial): see the module's docstring. `cwd` and
    `pythonpath`: the sweep driver's working directory and where it imported your factories from, for the job."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id()
    if (why := _stop_requested()) is not None:
        raise Stopped(f"trial {trial_id} not started: {why} ({STOPPED})")
    trials = Path(trials_dir)
    trials.mkdir(parents=True, exist_ok=True)
    cfg_file = trials / f"{trial_id}.yaml"
    cfg_file.write_text(yaml.safe_dump(trial_config(base, values, trials, trial_id), sort_keys=False))
    tail = Tail(trials / trial_id / METRICS_FILE)
    tail.skip_to_end()  # a restored sweep: the evaluations before it were reported then
    path = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    env.pop(RESULT_ENV, None)  # batch mode's result file is the sweep's, not its trials'
    with open(trials / f"{trial_id}.log", "a") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raydist.job", strategy, "--config", str(cfg_file)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=_die_with_parent,
        )
        try:
            last_loss = _follow(proc, tail)
        finally:
            _stop(proc)
    if proc.returncode != 0:
        lines = (trials / f"{trial_id}.log").read_text().strip().splitlines()
        raise RuntimeError(f"trial {trial_id}: {strategy} exited {proc.returncode}: {lines[-1] if lines else ''}")
    summary = _report_summary(trials / trial_id / SUMMARY_FILE, last_loss)
    if summary.get("status") == "stopped":  # the cluster's stop request (a sweep's own stop ends the actor first)
        raise Stopped(
            f"trial {trial_id} stopped at step {summary.get('steps')}: {summary.get('stop_reason')} ({STOPPED})"
        )


def _follow(proc: subprocess.Popen, tail: Tail) -> float | None:
    from ray import tune

    last_loss = None
    while True:
        done = proc.poll() is not None
        reports, last_loss = evaluation_reports(tail.lines(), last_loss)
        for report in reports:
            tune.report(report)
        if done:
            return last_loss
        time.sleep(POLL_S)


def _report_summary(path: Path, last_loss: float | None) -> dict[str, Any]:
    """A job that completed reports its summary once more, marked `completed`: the results table tells a trial run
    to its end from one Tune stopped, and a trial restored after its job had completed gets its result. Returns
    the summary ({} without one)."""
    from ray import tune

    if not path.exists():
        return {}
    s = json.loads(path.read_text())
    if s.get("status") == "completed":
        tune.report(
            {
                "step": s.get("steps"),
                "test_accuracy": s.get("test_accuracy"),
                "test_loss": s.get("test_loss"),
                "loss": s.get("final_loss", last_loss),
                "completed": True,
            }
        )
    return s


def _stop_requested() -> str | None:
    from raydist.cluster.preemption import stop_requested

    request = stop_requested()
    return request.describe() if request else None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)  # a Ray driver dies at SIGTERM (Ray's own handler); SIGINT ends the job cleanly
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
