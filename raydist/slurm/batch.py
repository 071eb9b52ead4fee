"""Batch mode: `sbatch cluster/ray_up.slurm COMMAND...` runs COMMAND as the job's driver on the Ray cluster.

The command's exit status becomes the job's. At the time-limit warning (`--signal=B:USR1@...`) every run on the
cluster checkpoints and stops (raydist.slurm.interrupt), and the allocation requeues itself
(`scontrol requeue`, `#SBATCH --requeue`) so that the same command resumes the run at the step it stopped. A
SIGTERM (scancel, preemption) reaches every step of the job at once: the command is ended at once, Ray's nodes
drain themselves (which a raydist loop sees through Ray Train's preemption info), and requeueing is left to SLURM.
The requeue rule is `decide`, a pure function.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raydist.errors import RaydistError
from raydist.slurm.settings import Requeue
from raydist.summary import RESULT_ENV  # a raydist job also writes its summary there: how batch mode learns its status

TIME_LIMIT, PREEMPTION = "time_limit", "preemption"


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    signal: str | None = None
    """TIME_LIMIT (SIGUSR1, the --signal warning), PREEMPTION (SIGTERM) or None."""
    status: str | None = None
    """The raydist job's summary status (completed, stopped, exit_fault, ...), None for other commands or no
    summary."""


@dataclass(frozen=True)
class Decision:
    requeue: bool
    why: str


def decide(outcome: Outcome, restarts: int, cfg: Requeue) -> Decision:
    """Whether the allocation requeues itself after its command ended, and the one line that says why."""
    if outcome.signal == PREEMPTION:
        return Decision(
            False,
            "preempted or cancelled (SIGTERM): not requeueing here; a partition with "
            "PreemptMode=REQUEUE requeues the job itself",
        )
    if outcome.status == "exit_fault":  # raydist launch: the scripts had returned; a rerun would train again
        return Decision(
            False,
            f"the run completed, but a rank failed on its way out (exit {outcome.exit_code}): "
            "nothing to resume, not requeueing",
        )
    if outcome.signal == TIME_LIMIT:
        if outcome.status == "completed":
            return Decision(False, "time-limit warning, but the run had completed: nothing to resume")
        cause = "the time limit"
    elif outcome.exit_code == 0:
        return Decision(False, "command completed")
    elif not cfg.on_failure:
        return Decision(False, f"command failed (exit {outcome.exit_code}); not requeueing (requeue.on_failure is off)")
    else:
        cause = f"a failure (exit {outcome.exit_code})"
    if restarts >= cfg.max_requeues:
        return Decision(
            False,
            f"not requeueing after {cause}: the job was requeued {restarts} times already "
            f"(requeue.max_requeues={cfg.max_requeues})",
        )
    return Decision(True, f"requeueing after {cause} ({restarts + 1} of at most {cfg.max_requeues})")


def parse_time_left(text: str) -> float | None:
    """squeue's %L ('45', '12:03', '1:02:03', '2-01:02:03', 'UNLIMITED', 'INVALID') in seconds, or None."""
    text = text.strip()
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or len(parts) > 3 or (days and not days.isdigit()):
        return None
    seconds = 0
    for p in parts:  # [days-][hours:]minutes:seconds, leading fields left out
        seconds = seconds * 60 + int(p)
    return float(seconds + int(days or 0) * 86400)


def time_left(job_id: int) -> float | None:
    r = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%L"], capture_output=True, text=True)
    return parse_time_left(r.stdout) if r.returncode == 0 else None


def read_status(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None


class Supervisor:
    """Runs the command, turns the SLURM signals into a cluster-wide stop, and reports the outcome."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        result_file: Path,
        on_warning: Callable[[str, Supervisor], None],
        stop_wait_s: float,
        log: Callable[[str], None] = print,
    ):
        self.argv, self.env, self.result_file = argv, env, result_file
        self.on_warning, self.stop_wait_s, self.log = on_warning, stop_wait_s, log
        self.signal: str | None = None
        self._pending: str | None = None
        self.proc: subprocess.Popen | None = None

    def _on_signal(self, signum, _frame) -> None:
        # Only note it: the work (connecting to Ray, draining) happens in the main loop, not in a handler.
        self._pending = TIME_LIMIT if signum == signal.SIGUSR1 else PREEMPTION

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self) -> Outcome:
        for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.result_file.unlink(missing_ok=True)
        # Its own process group: SLURM's signal to the batch shell must not reach the command directly.
        self.proc = subprocess.Popen(
            self.argv, env={**self.env, RESULT_ENV: str(self.result_file)}, start_new_session=True
        )
        while self.proc.poll() is None:
            if self._pending and not self.signal:
                self.signal = self._pending
                if self.signal == TIME_LIMIT:
                    self.on_warning(self.signal, self)  # returns once the runs stopped, or its bound passed
                    self._stop_command(self.stop_wait_s)
                else:  # SIGTERM reached every step at once: Ray is going down, there is no time to stop runs
                    self._stop_command(0)
            time.sleep(0.2)
        return Outcome(self.proc.returncode, self.signal, read_status(self.result_file))

    def _stop_command(self, wait_s: float) -> None:
        """Give the command `wait_s` more to exit, then end it (SIGTERM, then SIGKILL)."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            if wait_s:
                self.log(f"the command did not stop within {wait_s:.0f} s: ending it")
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=grace)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue


def requeue(job_id: int) -> None:
    r = subprocess.run(["scontrol", "requeue", str(job_id)], capture_output=True, text=True)
    if r.returncode != 0:  # e.g. a cluster with JobRequeue=0 and no #SBATCH --requeue
        why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise RaydistError(f"scontrol requeue {job_id} failed: {why}")
