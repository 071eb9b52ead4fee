"""A run in MLflow (raydist.observability.tracking), read back with MLflow's own client; no Ray here. The job's own
run is checked in tests/test_sync_job.py (a stopped and resumed run, one MLflow run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raydist.config import load_config
from raydist.errors import UsageError
from raydist.observability import tracking
from raydist.observability.tensorboard_log import RunLog
from tests.support.mlflowutil import client, mlflow_history, mlflow_runs


@pytest.fixture(autouse=True)
def _no_tracking_uri(monkeypatch):
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)


def _session(run_dir: Path, start: int, end: int, loss: float, evals: tuple[int, ...] = ()) -> None:
    cfg = load_config(None, [], [f"run.storage_path={run_dir.parent}", f"run.name={run_dir.name}",
                                 "run.tensorboard=false"])  # fmt: skip
    log = RunLog(cfg, enabled=True, start_step=start)
    for step in range(start + 1, end + 1):
        log.write({"step": step, "loss": loss, "lr": 0.1, "step_time_s": 0.01, "time_s": 0.5 * step})
        if step in evals:
            log.write({"eval_at_step": step, "test_loss": loss, "test_accuracy": 0.5})
    log.close()


def _log(run_dir: Path, status: str, steps: int, **extra) -> str:
    summary = {"status": status, "steps": steps, "test_accuracy": 0.5, "restarts": 0, "resumed_from_step": None}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return tracking.log_run(
        storage_dir=str(run_dir.parent),
        experiment="raydist",
        run_dir=str(run_dir),
        name=run_dir.name,
        config={"optim": {"lr": 0.1, "name": "adamw"}, "train": {"epochs": 2}, "data": {"args": {}}},
        summary=summary,
        tags={"raydist.strategy": "sync"},
        **extra,
    )


def test_a_nested_config_becomes_dotted_params():
    assert tracking.flat_params({"optim": {"lr": 0.1, "name": "adamw"}, "data": {"args": {}}, "x": None}) == {
        "optim.lr": "0.1",
        "optim.name": "adamw",
        "data.args": "{}",
        "x": "null",
    }


def test_a_stopped_then_resumed_run_is_one_mlflow_run_with_each_step_once(tmp_path):
    run_dir = tmp_path / "r"
    _session(run_dir, 0, 8, loss=2.0, evals=(5,))
    (run_dir / "checkpoint_step00000008").mkdir()
    (run_dir / "checkpoint_step00000008" / "model.pt").write_bytes(b"x" * 10)
    first = _log(run_dir, "stopped", 8)
    runs = mlflow_runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "KILLED"
    _session(run_dir, 8, 12, loss=1.0, evals=(10, 12))
    second = _log(run_dir, "completed", 12)
    assert second == first
    (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "FINISHED" and run.info.run_name == "r"
    assert run.data.params == {"optim.lr": "0.1", "optim.name": "adamw", "train.epochs": "2", "data.args": "{}"}
    assert run.data.tags["raydist.strategy"] == "sync" and run.data.tags["raydist.status"] == "completed"
    loss = mlflow_history(tmp_path, run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in loss] == [(s, 2.0 if s <= 8 else 1.0) for s in range(1, 13)]
    assert [m.step for m in mlflow_history(tmp_path, run.info.run_id, "eval/test_accuracy")] == [5, 10, 12]
    assert run.data.metrics["summary/steps"] == 12 and "summary/resumed_from_step" not in run.data.metrics
    names = {a.path for a in client(tmp_path).list_artifacts(run.info.run_id)}
    assert names == {"summary.json", "metrics.jsonl"}  # the checkpoint stays in the run directory


def test_a_failed_session_is_logged_failed_with_its_error(tmp_path):
    run_dir = tmp_path / "f"
    _session(run_dir, 0, 3, loss=2.0)
    tracking.log_run(storage_dir=str(tmp_path), experiment="e", run_dir=str(run_dir), name="f", config={},
                     summary=None, tags={}, failed="RuntimeError: boom")  # fmt: skip
    (run,) = mlflow_runs(tmp_path, "e")
    assert run.info.status == "FAILED" and run.data.tags["raydist.error"] == "RuntimeError: boom"
    assert [m.step for m in mlflow_history(tmp_path, run.info.run_id, "train/loss")] == [1, 2, 3]


def test_tracking_is_on_with_run_mlflow_or_a_tracking_uri(monkeypatch, tmp_path):
    assert not tracking.enabled(False) and tracking.enabled(True)
    assert tracking.tracking_uri(str(tmp_path)) == f"file:{tmp_path}/mlruns"
    monkeypatch.setenv(tracking.TRACKING_ENV, "http://127.0.0.1:5000")
    assert tracking.enabled(False) and tracking.tracking_uri(str(tmp_path)) == "http://127.0.0.1:5000"


def test_tracking_without_mlflow_installed_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "mlflow", None)  # import mlflow then raises ImportError
    tracking.check_available(False)  # off: not needed
    with pytest.raises(UsageError, match=r"^run.mlflow is true but MLflow is not installed: pip install"):
        tracking.check_available(True)


def test_a_launched_scripts_hook_values_are_one_record_per_step_seen_and_every_number_is_logged(tmp_path):
    from raydist.launcher.hook_records import HookRecords

    run_dir = tmp_path / "launch-train"
    records = HookRecords(str(run_dir))
    for status in ({}, {"step": 5, "loss": 2.0, "first_step_unix": 1.0}, {"step": 5, "loss": 2.0},
                   {"step": 9, "loss": 1.5, "accuracy": 0.7, "updated_unix": 3.0}):  # fmt: skip
        records.note(status)
    records.close()
    tracking.log_run(storage_dir=str(tmp_path), experiment="raydist", run_dir=str(run_dir), name="launch-train",
                     config={"workers": 2}, summary={"status": "completed"}, tags={}, every_key=True)  # fmt: skip
    (run,) = mlflow_runs(tmp_path)
    assert [(m.step, m.value) for m in mlflow_history(tmp_path, run.info.run_id, "train/loss")] == [(5, 2.0), (9, 1.5)]
    assert [m.step for m in mlflow_history(tmp_path, run.info.run_id, "train/accuracy")] == [9]
    assert "train/first_step_unix" not in run.data.metrics and "train/updated_unix" not in run.data.metrics


def test_a_store_that_fails_is_one_line_and_the_run_goes_on(monkeypatch, tmp_path):
    monkeypatch.setenv(tracking.TRACKING_ENV, "file:/proc/raydist-no-such-store")  # nothing can be created there
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    said: list[str] = []
    tracking.log_as_a_view(said.append, "r", str(tmp_path), experiment="raydist", run_dir=str(tmp_path / "r"),
                           config={}, summary={"status": "completed"}, tags={})  # fmt: skip
    assert len(said) == 1 and said[0].startswith("r: not logged to MLflow ("), said
