"""scaling.engine=launch: a loop strategy's workers as plain processes of `raydist launch`, end to end: it learns,
stops on the launcher's signal with a checkpoint, resumes at the exact step with the losses of an uninterrupted run,
survives a killed rank, and refuses the strategies it cannot run.

The killed rank and the stop signal run on the job's embedded Ray instance, where the ranks start before Ray does;
the tests marked `shared_ray` join the shared Ray head (tests/support/sharedray.py) as a job joins a cluster, where the
head's warm interpreter forks the ranks, as a SLURM node's does: an embedded instance of its own costs a short job
much CPU on the 2-core suite (benchmarks/shared_head.py, docs/dev/testing.md)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from raydist.observability.metrics import read_steps
from tests.support.jobutil import (
    REPO,
    SHARED_RAY,
    clean_env,
    launched_rank_pid,
    refusal,
    run_job,
    summary,
    tinygpt_job,
    wait_for_steps,
)

pytestmark = pytest.mark.slow

ENGINE = "scaling.engine=launch"


def top_workers(temp_dir: Path, run: str, job: subprocess.Popen, timeout: float = 90) -> list[dict]:
    """`raydist top --once --json` on the job's embedded instance, once both workers show the loop's metrics."""
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(
            [sys.executable, "-m", "raydist.cli", "top", "--once", "--json", "--temp-dir", str(temp_dir / "ray")],
            cwd=REPO,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        runs = {x["run"]: x for x in json.loads(r.stdout)["runs"]} if r.returncode == 0 else {}
        workers = runs.get(run, {}).get("processes", [])
        if len(workers) == 2 and all("samples_per_s" in w and "comm_wait_share" in w for w in workers):
            assert runs[run]["strategy"] == "sync", runs[run]
            return workers
        assert job.poll() is None and time.monotonic() < deadline, (r.stdout[-2000:], r.stderr[-2000:])
        time.sleep(1)


@pytest.mark.long
@pytest.mark.shared_ray
def test_sync_learns_and_a_stopped_run_resumes_with_identical_losses(tmp_path):
    common = [
        f"run.storage_path={tmp_path}",
        ENGINE,
        "train.epochs=2",
        "checkpoint.every_steps=10",
        "model.dropout=0.2",
    ]  # dropout draws random numbers: resuming must restore each rank's RNG
    proc = run_job("sync", *common, "run.name=straight")
    straight = summary(proc)
    assert straight["status"] == "completed" and straight["steps"] == 44 and straight["workers"] == 2
    # The head's warm interpreter forked both ranks, as a raydist node's does (an embedded instance's start cold)
    assert straight["warm_workers"] == (2 if SHARED_RAY else 0), straight
    assert straight["test_accuracy"] >= 0.8, straight
    assert straight["checkpoint"] == str(tmp_path / "straight" / "checkpoint_step00000044")
    up = straight["startup_s"]
    # On the embedded instance the workers start before Ray is up (test_launch checks that order): `connect` may
    # come after `workers`, even after the first step.
    assert 0 < up["workers"] <= up["ready"] <= up["first_step"] < straight["wall_s"] + 1 and up["connect"] > 0, up
    # checkpoint.keep=2: the newest two, published whole
    assert sorted(p.name for p in (tmp_path / "straight").glob("checkpoint_step*")) == [
        "checkpoint_step00000040",
        "checkpoint_step00000044",
    ]
    assert (tmp_path / "straight" / "logs" / "rank1.log").exists()
    assert "[raydist] sync: step 44/44 (100%)" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr

    stopped = summary(run_job("sync", *common, "run.name=resumed", "train.stop_at_step=13"))
    assert stopped["status"] == "stopped" and stopped["steps"] == 13
    resumed = summary(run_job("sync", *common, "run.name=resumed"))
    assert resumed["resumed_from_step"] == 13 and resumed["steps"] == 44 and resumed["status"] == "completed"
    a, b = read_steps(straight["metrics_file"]), read_steps(resumed["metrics_file"])
    assert sorted(b) == sorted(a) == list(range(1, 45))
    for step in range(14, 45):
        assert b[step]["loss"] == a[step]["loss"], (step, a[step], b[step])
    assert resumed["test_accuracy"] == straight["test_accuracy"]


@pytest.mark.long
def test_a_killed_rank_restarts_the_group_from_the_checkpoint_and_a_stop_signal_checkpoints(tmp_path):
    temp = Path(tempfile.mkdtemp(prefix="re-", dir="/tmp"))  # short: Ray's socket paths live under it
    common = [f"run.storage_path={tmp_path}", ENGINE, "train.epochs=60", "checkpoint.every_steps=20", "run.name=chaos"]
    job = subprocess.Popen(
        [sys.executable, str(REPO / "jobs" / "sync.py"), *sum((["--set", o] for o in common), [])],
        cwd=REPO,
        env=clean_env(TMPDIR=str(temp)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        run_dir = tmp_path / "chaos"
        wait_for_steps(run_dir / "metrics.jsonl", 30, job)
        # `raydist top` shows every worker with the loop's own metrics, which its agent exports for it
        for w in top_workers(temp, "chaos", job):
            assert w["step"] >= 1 and w["samples_per_s"] > 0 and 0 <= w["comm_wait_share"] <= 1, w
        victim = launched_rank_pid(run_dir, 1, start=1)
        os.kill(victim, signal.SIGKILL)
        launched_rank_pid(run_dir, 1, start=2)
        wait_for_steps(run_dir / "metrics.jsonl", sum(1 for _ in (run_dir / "metrics.jsonl").open()) + 30, job)
        job.send_signal(signal.SIGTERM)  # as Ctrl-C or a batch script's own stop: the ranks checkpoint and stop
        out, err = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            job.kill()
        shutil.rmtree(temp, ignore_errors=True)
    assert f"rank 1 on vm (pid {victim}) was killed by signal 9" in err.replace(os.uname().nodename, "vm"), err
    assert "restarting every rank (1 of at most 3)" in err, err
    result = summary(subprocess.CompletedProcess(job.args, job.returncode, out, err))
    assert result["status"] == "stopped" and result["restarts"] == 1, result
    assert result["stop_reason"].startswith("raydist launch sent SIGTERM"), result
    assert result["checkpoint"].endswith(f"checkpoint_step{result['steps']:08d}")

    from tests.support import sharedray

    # The resume is a job like any other: on the shared head, as the marked tests' jobs are.
    resumed = summary(
        run_job("sync", *common, f"train.stop_at_step={result['steps'] + 5}", env=clean_env(**sharedray.job_env()))
    )
    assert resumed["resumed_from_step"] == result["steps"] and resumed["steps"] == result["steps"] + 5


@pytest.mark.parametrize("job", ["async", "heal"])
def test_strategies_that_need_ray_train_or_actors_are_refused(job):
    line = refusal(job, "--set", ENGINE)
    assert f"scaling.engine=launch runs sync, local_sgd, fsdp; {job} needs Ray Train" in line, line


@pytest.mark.long  # its short version: your own model and data train and resume on the launch engine (sync)
@pytest.mark.shared_ray
def test_local_sgd_and_fsdp_run_on_the_launch_engine(tmp_path):
    for job in ("local_sgd", "fsdp"):
        result = summary(run_job(job, f"run.storage_path={tmp_path}", ENGINE, "train.epochs=1"))
        assert result["status"] == "completed" and result["steps"] == 22 and result["workers"] == 2, result


@pytest.mark.shared_ray
def test_a_run_the_workers_end_as_failed_exits_1_with_one_line(tmp_path):
    proc = run_job(
        "sync",
        f"run.storage_path={tmp_path}",
        ENGINE,
        "train.epochs=2",
        "faults.inject_desync_rank=1",
        "faults.on_desync=stop",
        "faults.desync_every_steps=5",
    )
    assert proc.returncode == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("raydist: error: training failed: desync at step 5: parameters of rank 1 differ"), last
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.shared_ray
def test_your_own_model_and_data_train_and_resume_on_the_launch_engine(tmp_path):
    # examples/tinygpt, given by import path and run from examples/ as a user runs one from their project: the
    # ranks import it from the directory the job was started in.
    common = ["train.max_steps=16", f"run.storage_path={tmp_path}", ENGINE]
    stopped = summary(tinygpt_job("sync", *common, "train.stop_at_step=8"))
    assert stopped["status"] == "stopped" and stopped["steps"] == 8 and stopped["run_name"] == "sync-tinygpt"
    resumed = summary(tinygpt_job("sync", *common))
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == 8 and resumed["steps"] == 16
    assert resumed["test_accuracy"] > 1 / 64  # per-token accuracy, above chance
