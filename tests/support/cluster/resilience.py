"""The time-limit warning and the mid-run node loss on the emulated SLURM cluster, as scenarios that return what
they measured: tests/test_slurm_resilience.py asserts on them, benchmarks/slurm_resilience.py stores rounds.

The warning is sent as SLURM sends it (`--signal=B:USR1@...` signals the batch shell): `scancel --batch
--signal=USR1`. After `scontrol requeue` SLURM holds a job back a while (its BeginTime); these move that to now.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import subprocess
import time
from pathlib import Path

from tests.support.cluster import rayup
from tests.support.cluster.emucluster import EmulatedCluster


def wait_text(job: rayup.RayUpJob, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, job.text())
        if m:
            return m
        time.sleep(0.2)
    raise AssertionError(f"no {pattern!r} within {timeout:.0f}s:\n{job.text()[-5000:]}")


def release_after_requeue(job: rayup.RayUpJob) -> float:
    """Once the job is pending again and its nodes are idle, let it start now instead of after SLURM's requeue
    delay. (Released while a node still held the killed instance, slurmd refuses the launch: "Job 1 already
    killed, do not launch batch job"; the delay is there for that.) Returns the delay SLURM had set: seconds from
    the moment the job was seen pending to its BeginTime (NaN if SLURM shows none)."""
    deadline = time.monotonic() + 60
    while job.cluster.job_state(job.job_id) != "PENDING":
        assert time.monotonic() < deadline, job.text()[-3000:]
        time.sleep(0.3)
    shown = job.cluster.run("master-node", ["scontrol", "show", "job", str(job.job_id)], check=True).stdout
    held_back_s = _eligible_in(shown)
    job.cluster.wait_idle(60)
    time.sleep(3)  # slurmd forgets the killed instance a moment after the node shows idle
    job.cluster.run("master-node", ["scontrol", "update", f"JobId={job.job_id}", "StartTime=now"], check=True)
    return held_back_s


def _eligible_in(shown: str) -> float:
    """Seconds until the job may start, from `scontrol show job` (which shows its BeginTime as EligibleTime); NaN
    when SLURM shows none."""
    m = re.search(r"\bEligibleTime=(\S+)", shown)
    try:
        return datetime.datetime.fromisoformat(m.group(1)).timestamp() - time.time() if m else math.nan
    except ValueError:  # 'Unknown'
        return math.nan


def trained_past(run_dir: Path, step: int) -> bool:
    """The run's metrics.jsonl (on the shared storage) holds a step record past `step`: it trains."""
    try:
        records = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return False
    return any('"step": ' in r and json.loads(r).get("step", 0) > step for r in records if r.strip())


@dataclasses.dataclass
class Warned:
    """A batch job warned once its run trained, requeued, and completed."""

    job: rayup.RayUpJob
    stopped_at: int  # the step the warning stopped the run at
    warning_to_checkpoint_s: float  # from the warning to the stop checkpoint's manifest on disk
    held_back_s: float  # SLURM's delay before the requeued job may start again (its BeginTime), cut short here


def warn_and_resume(
    cluster: EmulatedCluster, name: str, command: list[str], run_dir: Path, after: str = "", nodes: int = 3
) -> Warned:
    """Batch job on `nodes` nodes; the time-limit warning once `run_dir`'s run trains (and `after` exists); waits
    until the job completes after its requeue."""
    cluster.wait_idle(60)
    job = rayup.submit(cluster, rayup.write_config(cluster, name), nodes=nodes, command=tuple(command))
    deadline = time.monotonic() + 240
    while not trained_past(run_dir, 0) or (after and not Path(after).exists()):
        assert time.monotonic() < deadline and cluster.job_state(job.job_id) in ("PENDING", "RUNNING"), job.text()[
            -4000:
        ]
        time.sleep(0.2)
    warned = time.time()
    cluster.run("master-node", ["scancel", "--batch", "--signal=USR1", str(job.job_id)], check=True)
    stopped_at = int(wait_text(job, r"stopping (at|after) step (\d+)", timeout=60).group(2))
    manifest = run_dir / f"checkpoint_step{stopped_at:08d}" / "manifest.json"
    wait_text(job, r"requeueing after the time limit \(1 of at most 3\)", timeout=90)
    took = manifest.stat().st_mtime - warned
    held_back_s = release_after_requeue(job)
    state = cluster.wait_job(job.job_id, timeout=300)
    assert state == "COMPLETED", f"{state}\n{job.text()[-3000:]}\n{cluster.log_tail(40)}"
    return Warned(job, stopped_at, took, held_back_s)


def submit_sync(cluster: EmulatedCluster, job: rayup.RayUpJob, *overrides: str) -> subprocess.Popen:
    """`ray job submit` of jobs/sync.py with `overrides` to `job`'s Ray cluster, from the head node."""
    sets = " ".join(f"--set {o}" for o in overrides)
    return cluster.popen(
        "master-node",
        f"ray job submit --working-dir . -- python jobs/sync.py {sets}",
        env=job.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@dataclasses.dataclass
class NodeLost:
    """A fixed-size run whose node02 lost its whole Ray mid-run."""

    returncode: int
    output: str
    kill_to_exit_s: float


def lose_a_node_mid_run(cluster: EmulatedCluster, name: str, node_loss_timeout_s: float = 15) -> NodeLost:
    """3 workers on 3 nodes of a fresh Ray cluster; node02's Ray SIGKILLed once the run is past step 5."""
    cluster.wait_idle(60)
    job = rayup.submit(cluster, rayup.write_config(cluster, name))
    try:
        job.wait_for("Ray cluster ready", timeout=150)
        run_dir = cluster.shared / "runs" / name
        proc = submit_sync(
            cluster,
            job,
            "scaling.num_workers=3",
            f"scaling.node_loss_timeout_s={node_loss_timeout_s:g}",
            f"run.storage_path={cluster.shared}/runs",
            f"run.name={name}",
            "train.epochs=25",
            "checkpoint.every_steps=20",
            "straggler.worker=0",
            "straggler.slowdown=3",
        )
        deadline = time.monotonic() + 240
        while not trained_past(run_dir, 5):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.1)
        rayup.kill_node_ray(cluster, "node02", job.job_id)
        killed = time.monotonic()
        out = proc.communicate(timeout=300)[0]
        return NodeLost(proc.returncode, out, time.monotonic() - killed)
    finally:
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
