"""jobs/sync.py end to end on a local Ray instance: it learns, and a stopped run resumes exactly."""

from __future__ import annotations

import pytest

from jobutil import run_job, summary
from raydist.metrics import read_steps

pytestmark = pytest.mark.slow


def test_two_workers_reach_the_accuracy_threshold_on_digits(tmp_path):
    result = summary(run_job("sync", f"run.storage_path={tmp_path}", "run.name=acc"))
    assert result["strategy"] == "sync" and result["workers"] == 2
    assert result["test_accuracy"] >= 0.95, result
    assert result["steps"] == 20 * 22  # 1437 training digits / 2 workers / batch 32 = 22 steps per epoch
    assert result["checkpoint"].startswith(str(tmp_path / "acc"))


def test_stopped_run_resumes_at_the_next_step_with_identical_losses(tmp_path):
    common = [f"run.storage_path={tmp_path}", "train.epochs=2", "checkpoint.every_steps=10",
              "model.dropout=0.2",  # dropout draws random numbers: resuming must restore each rank's RNG
              "train.grad_accum=2", "train.batch_size=16"]
    straight = summary(run_job("sync", *common, "run.name=straight"))
    # The interrupted leg uploads its checkpoints in the background; the resumed leg must still find them.
    stopped = summary(run_job("sync", *common, "run.name=resumed", "train.stop_at_step=13", "checkpoint.async_upload=true"))
    assert stopped["steps"] == 13  # mid-epoch: 22 steps per epoch
    assert stopped["status"] == "stopped" and stopped["stop_reason"] == "train.stop_at_step=13"
    resumed = summary(run_job("sync", *common, "run.name=resumed"))
    assert resumed["resumed_from_step"] == 13
    assert resumed["steps"] == straight["steps"] == 44

    a = read_steps(straight["metrics_file"])
    b = read_steps(resumed["metrics_file"])
    assert sorted(b) == sorted(a) == list(range(1, 45))
    for step in range(14, 45):
        assert b[step]["loss"] == a[step]["loss"], (step, a[step], b[step])
        assert b[step]["lr"] == a[step]["lr"]
    assert resumed["test_accuracy"] == straight["test_accuracy"]
