"""jobs/sync.py end to end on a local Ray instance: it learns, and a stopped run resumes exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raydist.observability.metrics import read_steps
from tests.support import jobutil
from tests.support.boardutil import config_texts, read_board, scalar_steps
from tests.support.jobutil import REPO, clean_env, run_job, summary
from tests.support.mlflowutil import mlflow_history, mlflow_runs

pytestmark = pytest.mark.slow


def test_two_workers_reach_the_accuracy_threshold_on_digits(tmp_path):
    proc = run_job("sync", f"run.storage_path={tmp_path}", "run.name=acc")
    result = summary(proc)
    assert result["strategy"] == "sync" and result["workers"] == 2
    assert result["test_accuracy"] >= 0.95, result
    assert result["steps"] == 20 * 22  # 1437 training digits / 2 workers / batch 32 = 22 steps per epoch
    assert result["checkpoint"].startswith(str(tmp_path / "acc"))
    # Where the start-up went, in order, all of it before the job's end.
    up = result["startup_s"]
    assert 0 < up["connect"] <= up["workers"] <= up["ready"] <= up["first_step"] < result["wall_s"] + 1, up

    # A quiet console (not a terminal here: plain progress lines, a bounded number), the JSON line last on stdout.
    # (Ray Train's PlacementGroupCleaner printed a traceback here when other Ray instances ran on the host; raydist
    # starts none: raydist.engines.raytrain_trainer.)
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) <= 30, "\n".join(lines)
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("[raydist] sync: step ")]
    assert 3 <= len(progress) <= 12, proc.stderr
    assert progress[-1].startswith("[raydist] sync: step 440/440 (100%) loss ") and "test_accuracy 0.9" in progress[-1]
    assert any("samples/s ETA " in ln for ln in progress), progress
    assert f"[raydist] sync: run directory {tmp_path / 'acc'}" in proc.stderr
    assert "Reporting training result" not in proc.stdout + proc.stderr
    assert "Checkpoint successfully created" not in proc.stdout + proc.stderr
    assert "Started training worker group" not in proc.stdout + proc.stderr
    assert proc.stdout.splitlines()[-1].startswith('{"strategy": "sync"')

    # TensorBoard: one point per step and per evaluation (each epoch end), the config once, read as tensorboard does
    board = read_board(tmp_path / "acc")
    for tag in ("train/loss", "train/grad_norm", "train/lr", "train/step_time_s"):
        assert scalar_steps(board, tag) == list(range(1, 441)), tag
    assert (
        scalar_steps(board, "eval/test_accuracy") == scalar_steps(board, "eval/test_loss") == list(range(22, 441, 22))
    )
    assert board.Scalars("eval/test_accuracy")[-1].value == pytest.approx(result["test_accuracy"])
    assert board.Scalars("train/samples_per_s") and scalar_steps(board, "run/world_size") == [0]
    assert list(config_texts(board)) == [0] and "    name: acc\n" in config_texts(board)[0]

    # The same run again (a second `make run`) reports the finished run from its files: no Ray started, the same
    # summary; run.verbose changes only the console.
    assert "[raydist] local Ray: token auth on" in proc.stdout
    again = run_job("sync", f"run.storage_path={tmp_path}", "run.name=acc", "run.verbose=true")
    assert summary(again) == result
    assert "acc already completed 440 steps with this config" in again.stderr
    assert "local Ray" not in again.stdout + again.stderr and len(again.stdout.splitlines()) == 1, again


@pytest.mark.shared_ray
def test_stopped_run_resumes_at_the_next_step_with_identical_losses(tmp_path):
    common = [
        f"run.storage_path={tmp_path}",
        "train.epochs=2",
        "checkpoint.every_steps=10",
        "model.dropout=0.2",  # dropout draws random numbers: resuming must restore each rank's RNG
        "train.grad_accum=2",
        "train.batch_size=16",
    ]
    loud = run_job("sync", *common, "run.name=straight", "run.verbose=true")  # as --verbose does
    straight = summary(loud)
    # run.verbose brings Ray Train's lines and rank 0's per-report metrics back
    assert "Reporting training result" in loud.stdout + loud.stderr
    assert "Checkpoint successfully created" in loud.stdout + loud.stderr
    assert "[raydist] step 44 epoch 1 loss " in loud.stdout
    # The interrupted leg uploads its checkpoints in the background; the resumed leg must still find them.
    # Both legs logged to MLflow (its default store under the storage path)
    stopped = summary(
        run_job(
            "sync", *common, "run.name=resumed", "train.stop_at_step=13", "checkpoint.async_upload=true",
            "run.mlflow=true",
        )
    )  # fmt: skip
    assert stopped["steps"] == 13  # mid-epoch: 22 steps per epoch
    assert stopped["status"] == "stopped" and stopped["stop_reason"] == "train.stop_at_step=13"
    resumed = summary(run_job("sync", *common, "run.name=resumed", "run.mlflow=true"))
    assert resumed["resumed_from_step"] == 13
    assert resumed["steps"] == straight["steps"] == 44

    a = read_steps(straight["metrics_file"])
    b = read_steps(resumed["metrics_file"])
    assert sorted(b) == sorted(a) == list(range(1, 45))
    for step in range(14, 45):
        assert b[step]["loss"] == a[step]["loss"], (step, a[step], b[step])
        assert b[step]["lr"] == a[step]["lr"]
    assert resumed["test_accuracy"] == straight["test_accuracy"]

    # TensorBoard after the stop and resume: still exactly one point per step, the losses those of metrics.jsonl
    # (float32 in the event file), evaluations at the stop and at each epoch end, one config text per session.
    for name, evals, sessions in (("straight", [22, 44], [0]), ("resumed", [13, 22, 44], [0, 13])):
        board = read_board(tmp_path / name)
        assert scalar_steps(board, "train/loss") == scalar_steps(board, "train/lr") == list(range(1, 45)), name
        assert scalar_steps(board, "eval/test_accuracy") == evals, name
        assert sorted(config_texts(board)) == scalar_steps(board, "run/world_size") == sessions, name
    for event in read_board(tmp_path / "resumed").Scalars("train/loss"):
        assert event.value == pytest.approx(b[event.step]["loss"], rel=1e-6)

    # MLflow, read back with its client: one run for both legs, every step's loss once, the config, the summary
    run = mlflow_runs(tmp_path)
    assert [r.info.run_name for r in run] == ["resumed"] and run[0].info.status == "FINISHED"
    history = mlflow_history(tmp_path, run[0].info.run_id, "train/loss")
    assert [m.step for m in history] == list(range(1, 45))
    assert [m.value for m in history] == [b[s]["loss"] for s in range(1, 45)]
    assert run[0].data.params["train.epochs"] == "2" and run[0].data.params["run.name"] == "resumed"
    assert run[0].data.metrics["summary/test_accuracy"] == resumed["test_accuracy"]

    if jobutil.SHARED_RAY:  # the shared head's warm interpreter forked every job's Ray workers, as a node's does
        from tests.support import sharedray

        assert sharedray.head().forked_jobs() >= 3
        assert "without the warm interpreter" not in loud.stdout + loud.stderr


@pytest.mark.long
def test_the_driver_starts_the_autoscaling_coordinator_that_ray_train_waits_for():
    # raydist.engines.raytrain.start_autoscaling_coordinator goes through Ray's own get-or-create and says nothing when it
    # cannot: a Ray release that renames it would lose the speed-up silently (docs/dev/startup-changes.md). This fails
    # instead.
    code = (
        "import ray; ray.init(num_cpus=1, include_dashboard=False, logging_level='ERROR');"
        "from raydist.engines.raytrain import start_autoscaling_coordinator; start_autoscaling_coordinator();"
        "ray.get_actor('AutoscalingCoordinator', namespace='AutoscalingCoordinator'); print('started')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("started"), proc.stderr[-2000:]
