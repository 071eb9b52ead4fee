"""A completed run is reported again without Ray only when nothing that decides its outcome changed."""

from __future__ import annotations

import dataclasses
import shutil

from raydist.config import job_defaults, load_config
from raydist.engines import finished
from raydist.summary import JobSummary


def completed_run(tmp_path, *overrides: str):
    cfg = load_config(job_defaults("sync"), [], [f"run.storage_path={tmp_path}", "run.name=r", *overrides], job="sync")
    finished.record("sync", cfg)
    ckpt = tmp_path / "r" / "checkpoint_000001"
    ckpt.mkdir()
    JobSummary(
        strategy="sync",
        run_name="r",
        run_dir=str(tmp_path / "r"),
        ray="local",
        workers=2,
        status="completed",
        steps=440,
        total_steps=440,
        resumed_from_step=None,
        wall_s=30.0,
        train_time_s=4.0,
        test_accuracy=0.96,
        test_loss=0.1,
        final_loss=0.1,
        samples_per_s=1.0,
        steps_per_s=1.0,
        checkpoint=str(ckpt),
        metrics_file="",
    ).write()
    return cfg, ckpt


def reloaded(tmp_path, *overrides: str):
    return load_config(job_defaults("sync"), [], [f"run.storage_path={tmp_path}", "run.name=r", *overrides], job="sync")


def test_the_same_config_gets_the_stored_summary(tmp_path):
    completed_run(tmp_path)
    again = finished.completed_summary("sync", reloaded(tmp_path, "run.verbose=true"))
    assert again is not None and again.test_accuracy == 0.96 and again.wall_s == 30.0


def test_a_changed_config_job_or_missing_checkpoint_trains(tmp_path):
    _, ckpt = completed_run(tmp_path)
    assert finished.completed_summary("sync", reloaded(tmp_path, "train.epochs=21")) is None
    assert finished.completed_summary("sync", reloaded(tmp_path, "optim.lr=0.01")) is None
    assert finished.completed_summary("sync", reloaded(tmp_path, "scaling.num_workers=3")) is None
    assert finished.completed_summary("local_sgd", reloaded(tmp_path)) is None
    shutil.rmtree(ckpt)
    assert finished.completed_summary("sync", reloaded(tmp_path)) is None


def test_a_stopped_run_or_one_without_a_record_trains(tmp_path):
    cfg, _ = completed_run(tmp_path)
    path = tmp_path / "r" / "summary.json"
    s = JobSummary.read(path)
    dataclasses.replace(s, status="stopped", steps=13).write()
    assert finished.completed_summary("sync", cfg) is None
    s.write()
    (tmp_path / "r" / finished.JOB_FILE).unlink()
    assert finished.completed_summary("sync", cfg) is None
    (tmp_path / "r" / finished.JOB_FILE).write_text("{torn")
    assert finished.completed_summary("sync", cfg) is None


def test_a_reported_run_still_hands_its_summary_to_batch_mode(tmp_path, monkeypatch):
    from raydist.job import run_job
    from raydist.summary import RESULT_ENV

    cfg, _ = completed_run(tmp_path)
    monkeypatch.setenv(RESULT_ENV, str(tmp_path / "result.json"))
    summary = run_job("sync", reloaded(tmp_path))  # no Ray here: the completed run is reported, not resumed
    assert summary.wall_s == 30.0 and JobSummary.read(tmp_path / "result.json") == summary
