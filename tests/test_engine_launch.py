"""scaling.engine=launch: a loop strategy's workers as plain processes of `raydist launch`, end to end on the
embedded Ray instance: it learns, stops on the launcher's signal with a checkpoint, resumes at the exact step with
the losses of an uninterrupted run, survives a killed rank, and refuses the strategies it cannot run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from jobutil import refusal, run_job, start_job, summary, wait_for_steps
from raydist.observability.metrics import read_steps

pytestmark = pytest.mark.slow

ENGINE = "scaling.engine=launch"


def ranks_of(job_pid: int) -> list[int]:
    """The job's rank processes (descendants of its embedded Ray running raydist.train.launched), by rank order of
    start: only what this test started is ever signalled."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    found, todo = [], [job_pid]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            if b"raydist.train.launched" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return sorted(found)


def test_sync_learns_and_a_stopped_run_resumes_with_identical_losses(tmp_path):
    common = [f"run.storage_path={tmp_path}", ENGINE, "train.epochs=2", "checkpoint.every_steps=10",
              "model.dropout=0.2"]  # dropout draws random numbers: resuming must restore each rank's RNG
    proc = run_job("sync", *common, "run.name=straight")
    straight = summary(proc)
    assert straight["status"] == "completed" and straight["steps"] == 44 and straight["workers"] == 2
    assert straight["test_accuracy"] >= 0.8, straight
    assert straight["checkpoint"] == str(tmp_path / "straight" / "checkpoint_step00000044")
    up = straight["startup_s"]
    assert 0 < up["connect"] <= up["workers"] <= up["ready"] <= up["first_step"] < straight["wall_s"] + 1, up
    # checkpoint.keep=2: the newest two, published whole
    assert sorted(p.name for p in (tmp_path / "straight").glob("checkpoint_step*")) == [
        "checkpoint_step00000040", "checkpoint_step00000044"]
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


def test_a_killed_rank_restarts_the_group_from_the_checkpoint_and_a_stop_signal_checkpoints(tmp_path):
    common = [f"run.storage_path={tmp_path}", ENGINE, "train.epochs=60", "checkpoint.every_steps=20",
              "run.name=chaos"]
    job = start_job("sync", *common)
    metrics = tmp_path / "chaos" / "metrics.jsonl"
    wait_for_steps(metrics, 30, job)
    victim = ranks_of(job.pid)[-1]
    os.kill(victim, signal.SIGKILL)
    time.sleep(1)
    wait_for_steps(metrics, sum(1 for _ in metrics.open()) + 30, job)  # training again after the restart
    job.send_signal(signal.SIGTERM)  # as Ctrl-C or a batch script's own stop: the ranks checkpoint and stop
    out, err = job.communicate(timeout=180)
    assert job.returncode == 0, err[-3000:]
    assert f"(pid {victim}) was killed by signal 9" in err and "restarting every rank (1 of at most 3)" in err, err
    result = summary(type("P", (), {"returncode": 0, "stdout": out, "stderr": err})())
    assert result["status"] == "stopped" and result["restarts"] == 1, result
    assert result["stop_reason"].startswith("raydist launch sent SIGTERM"), result
    assert result["checkpoint"].endswith(f"checkpoint_step{result['steps']:08d}")
    assert ranks_of(job.pid) == []

    resumed = summary(run_job("sync", *common, "train.epochs=60", "train.stop_at_step=" + str(result["steps"] + 5)))
    assert resumed["resumed_from_step"] == result["steps"] and resumed["steps"] == result["steps"] + 5


@pytest.mark.parametrize("job", ["async", "heal"])
def test_strategies_that_need_ray_train_or_actors_are_refused(job):
    line = refusal(job, "--set", ENGINE)
    assert f"scaling.engine=launch runs sync, local_sgd, fsdp; {job} needs Ray Train" in line, line


def test_local_sgd_and_fsdp_run_on_the_launch_engine(tmp_path):
    for job in ("local_sgd", "fsdp"):
        result = summary(run_job(job, f"run.storage_path={tmp_path}", ENGINE, "train.epochs=1"))
        assert result["status"] == "completed" and result["steps"] == 22 and result["workers"] == 2, result
