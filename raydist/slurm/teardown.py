"""Stop this job's Ray processes on this node and remove its temp dir; never anything of another job or user.

A node's Ray processes are recognised by a tag in their environment (set on `ray start`, inherited by every Ray
daemon, worker and driver it spawns), not by name: `ray stop` matches names, so it would also end the Ray of
every other job sharing the node.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

TAG_ENV = "RAYDIST_RAY_TAG"


def job_tag(job_id: int, node: str) -> str:
    return f"{job_id}@{node}"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has already exited


def tagged_processes(tag: str, proc: Path = Path("/proc")) -> list[int]:
    """PIDs whose environment carries TAG_ENV=tag; other users' processes cannot be read, and are skipped."""
    needle = f"{TAG_ENV}={tag}".encode()
    me = os.getpid()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def terminate(pids: list[int], grace: float) -> list[int]:
    """SIGTERM, up to `grace` seconds to exit, then SIGKILL; returns the PIDs that needed the SIGKILL."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    killed = [p for p in pids if _alive(p)]
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed


def remove_temp_dir(path: Path, job_id: int) -> bool:
    """Remove the job's node-local temp dir; refuses any path that is not a raydist-<job id> dir."""
    if path.name != f"raydist-{job_id}" or not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not path.exists()


def cleanup_node(job_id: int, node: str, temp_dir: Path, grace: float) -> str:
    """Everything this job started on this node ends, and its temp dir goes; returns a one-line summary."""
    leftovers, killed = stop_leftovers(job_id, node, grace)
    removed = remove_temp_dir(temp_dir, job_id)
    return (
        f"{node}: stopped {len(leftovers)} leftover Ray process(es)"
        + (f" ({len(killed)} needed SIGKILL)" if killed else "")
        + (f", removed {temp_dir}" if removed else "")
    )


def stop_leftovers(job_id: int, node: str, grace: float) -> tuple[list[int], list[int]]:
    """Every process this job started on this node ends: (those found, those that needed SIGKILL)."""
    leftovers = tagged_processes(job_tag(job_id, node))
    return leftovers, (terminate(leftovers, grace) if leftovers else [])


def running_steps(job_id: int) -> list[str]:
    """This job's numbered steps ('<job>.<n>'); not the batch or extern step, which must not get the signal."""
    r = subprocess.run(
        ["squeue", "--steps", "--noheader", "--format=%i", f"--jobs={job_id}"], capture_output=True, text=True
    )
    return [s for s in r.stdout.split() if s.partition(".")[2].isdigit()]


def signal_steps(job_id: int) -> list[str]:
    """SIGTERM to every process of the job's steps, through SLURM.

    Not `kill` on the srun: srun answers SIGTERM by asking SLURM to SIGKILL the step, which would leave no time
    for the clean-up on each node.
    """
    steps = running_steps(job_id)
    for step in steps:
        subprocess.run(["scancel", "--quiet", "--signal=TERM", step], capture_output=True)
    return steps


def wait_exited(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True
