"""Run the jobs the way a user does (a subprocess with the venv's Python) and read their JSON summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


SHARED_RAY: dict[str, str] = {}
"""Set (by conftest) while a test marked `shared_ray` runs: what joins its jobs to the shared head (sharedray.py)."""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that would point a job at somebody else's Ray; in a test marked
    `shared_ray`, pointing it at the shared head instead."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(SHARED_RAY)
    env.update(extra)
    return env


def run_job(
    job: str, *overrides: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    args = [sys.executable, str(REPO / "jobs" / f"{job}.py")]
    for o in overrides:
        args += ["--set", o]
    return subprocess.run(args, cwd=REPO, env=env or clean_env(), capture_output=True, text=True, timeout=timeout)


def tinygpt_job(job: str, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """A job on examples/tinygpt, a model raydist has never seen, given by import path and run from examples/, as a
    user runs one from their project."""
    args = [sys.executable, "-m", "raydist.job", job, "--config", "tinygpt/tinygpt.yaml"]
    for o in overrides:
        args += ["--set", o]
    return subprocess.run(args, cwd=REPO / "examples", env=clean_env(), capture_output=True, text=True, timeout=timeout)


def summary(proc: subprocess.CompletedProcess) -> dict:
    """The job's summary.json, which must equal its closing JSON line; fails with the job's output tail otherwise."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert last, f"no JSON summary\n{proc.stdout[-3000:]}"
    line = json.loads(last[-1])
    written = json.loads((Path(line["run_dir"]) / "summary.json").read_text())
    assert written == line, (written, line)
    return written


def refusal(job: str, *args: str, timeout: float = 120, started: bool = False, code: int = 2) -> str:
    """Run a job that must fail with one `raydist: error:` line on stderr and exit `code` (2: bad input, 1: a
    runtime failure); returns that line. Unless it `started` (and printed progress), its stdout must be empty too.
    """
    proc = subprocess.run(
        [sys.executable, str(REPO / "jobs" / f"{job}.py"), *args],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    lines = proc.stderr.strip().splitlines()
    quiet = started or proc.stdout.strip() == ""
    assert proc.returncode == code and quiet and len(lines) == 1, (
        proc.returncode,
        proc.stdout[-2000:],
        proc.stderr[-2000:],
    )
    assert lines[0].startswith("raydist: error:"), lines[0]
    return lines[0]


def ray_root(job: subprocess.Popen) -> int:
    """The process under which `job`'s Ray processes run: the job itself (its embedded instance), or the shared
    head (a test marked `shared_ray`, which runs one job at a time on it)."""
    if SHARED_RAY:
        from tests.support import sharedray

        return sharedray.head().pid
    return job.pid


def processes_titled(root: int, prefix: str, born_after: int | None = None) -> list[int]:
    """PIDs of `root`'s descendants whose title starts with `prefix` (Ray titles its workers 'ray::<Class>'),
    oldest first: only what this test started is ever signalled. `born_after`: only those started since that
    process was (on a shared head, an earlier job's actor may still be ending)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    since = _started(born_after) if born_after is not None else 0
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if pid != root and title.startswith(prefix) and _started(pid) >= since:
            found.append(pid)
    return sorted(found)


def job_processes_titled(job: subprocess.Popen, prefix: str) -> list[int]:
    """`job`'s Ray processes titled `prefix`: under its own instance, or those on the shared head started since it."""
    return processes_titled(ray_root(job), prefix, born_after=job.pid)


def _started(pid: int) -> int:
    """When `pid` started, in clock ticks since boot (-1 once it is gone, so that it is never picked)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


def start_job(job: str, *overrides: str) -> subprocess.Popen:
    args = [sys.executable, str(REPO / "jobs" / f"{job}.py")]
    for o in overrides:
        args += ["--set", o]
    return subprocess.Popen(args, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_steps(metrics: Path, steps: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Until metrics.jsonl holds `steps` records (the job is training), or fail with the job's output."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.exists() and sum(1 for _ in metrics.open()) >= steps:
            return
        if proc.poll() is not None:
            raise AssertionError(f"job ended early (exit {proc.returncode}):\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"no {steps} steps in {metrics} within {timeout} s")


def load_benchmark(name: str):
    """benchmarks/<name>.py, the module `benchmarks.<name>`: tests run the short versions of the benchmarks' chaos
    harnesses, and compare the docs with their reports."""
    import importlib

    return importlib.import_module(f"benchmarks.{name}")


def launched_rank_pid(run_dir: Path, rank: int, start: int = 1) -> int:
    """The pid of `rank`'s process in start `start` of a `raydist launch` run (a script's, or a job's on
    scaling.engine=launch), from the header the launcher writes to the rank's log."""
    import re
    import time

    log = run_dir / "logs" / f"rank{rank}.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        m = re.search(
            rf"=== raydist launch: start {start}, rank {rank} on \S+ \(pid (\d+)\)",
            log.read_text() if log.exists() else "",
        )
        if m:
            return int(m.group(1))
        time.sleep(0.2)
    raise AssertionError(f"no start {start} header in {log}")
