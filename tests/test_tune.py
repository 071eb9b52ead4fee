"""Sweeps with Ray Tune (jobs/tune.py): the space as the config writes it, refused before anything starts when a
trial's job would refuse it; a short sweep end to end, where ASHA stops the trailing trial, the best settings come
out as a config the strategy's job takes, and the same command again keeps the finished trials."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from raydist.config import load_config
from raydist.errors import ConfigError
from raydist.sweeps import space
from raydist.sweeps.trial import Tail, evaluation_reports
from tests.support.jobutil import REPO, run_job, summary
from tests.support.mlflowutil import mlflow_runs


def _cfg(*overrides: str):
    return load_config(None, [], list(overrides))


@pytest.mark.parametrize(
    "text, kind, args",
    [
        ("loguniform(1e-4, 1e-1)", "loguniform", (1e-4, 0.1)),
        ("uniform(0, 0.5)", "uniform", (0, 0.5)),
        ("randint(1, 4)", "randint", (1, 4)),
        ("choice([32, 64])", "choice", ((32, 64),)),
        ("grid([sgd, adamw])", "grid", (("sgd", "adamw"),)),
    ],
)
def test_each_distribution_is_read_as_written(text, kind, args):
    assert space.parse("optim.lr", text) == space.Dimension("optim.lr", kind, args)


@pytest.mark.parametrize(
    "key, text, message",
    [
        ("optim.lr", "loguniform(0, 0.1)", r"tune.space.optim.lr: needs 0 < low"),
        ("optim.lr", "uniform(0.1, 0.01)", r"tune.space.optim.lr: needs low < high"),
        ("optim.lr", "normal(0, 1)", r"tune.space.optim.lr: must be one of uniform\(...\)"),
        ("optim.lr", "choice([])", r"tune.space.optim.lr: choice\(\[a, b, ...\]\)"),
        ("optim.bogus", "choice([1, 2])", r"tune.space.optim.bogus: 1 is refused: unknown key 'optim.bogus'"),
        ("train.batch_size", "randint(0, 8)", r"tune.space.train.batch_size: 0 is refused: train.batch_size"),
        ("run.name", "choice([a, b])", r"tune.space.run.name: must be a run-config key like optim.lr outside run"),
    ],
)
def test_a_space_a_trial_would_refuse_is_refused_naming_the_key(key, text, message):
    with pytest.raises(ConfigError, match=message):
        space.dimensions(_cfg(), {key: text})


def test_the_space_can_come_from_set_as_nested_keys():
    cfg = _cfg("tune.space.optim.lr=loguniform(1e-4, 1e-1)", "tune.space.train.batch_size=choice([16, 32])")
    assert cfg.tune.space == {"optim.lr": "loguniform(1e-4, 1e-1)", "train.batch_size": "choice([16, 32])"}
    assert space.overrides({"optim.lr": 0.1, "train.batch_size": 16}) == {
        "optim": {"lr": 0.1},
        "train": {"batch_size": 16},
    }


def test_each_evaluation_becomes_one_report_with_the_latest_loss(tmp_path):
    path = tmp_path / "metrics.jsonl"
    tail = Tail(path)
    with open(path, "w") as f:
        f.write(json.dumps({"step": 1, "loss": 2.0}) + "\n" + json.dumps({"step": 2, "loss": 1.5}) + "\n")
        f.write(json.dumps({"eval_at_step": 2, "test_accuracy": 0.5, "test_loss": 1.4}) + "\n")
        f.write('{"step": 3, "lo')  # a line being written: not read until whole
    reports, last = evaluation_reports(tail.lines(), None)
    assert reports == [{"step": 2, "test_accuracy": 0.5, "test_loss": 1.4, "loss": 1.5}] and last == 1.5
    with open(path, "a") as f:
        f.write('ss": 1.0}\n')
    assert evaluation_reports(tail.lines(), last) == ([], 1.0)


@pytest.mark.slow
def test_a_one_trial_sweep_reports_its_job_and_writes_the_best_config_the_job_takes(tmp_path):
    """The short version of the next: a trial's job joins the sweep's Ray, its evaluations reach Tune."""
    done = summary(run_job("tune", f"run.storage_path={tmp_path}", "run.name=one", "tune.space.optim.lr=grid([0.02])",
                           "tune.num_samples=1", "train.epochs=1", "scaling.num_workers=1", timeout=600))  # fmt: skip
    assert (done["trials"], done["stopped_early"], done["errored"]) == (1, 0, 0) and done["best_metric"] >= 0.85
    assert done["best_values"] == {"optim.lr": 0.02}
    assert yaml.safe_load((tmp_path / "one" / "best.yaml").read_text())["optim"]["lr"] == 0.02
    (trial,) = json.loads((tmp_path / "one" / "results.json").read_text())["trials"]
    assert trial["steps"] == 44 and [step for step, _ in trial["curve"]] == [44, 44]  # its evaluation, its summary


@pytest.mark.long
def test_a_sweep_stops_the_trailing_trial_writes_the_best_config_and_resumes_without_rerunning(tmp_path):
    sweep = (
        f"run.storage_path={tmp_path}",
        "run.name=sweep",
        "tune.space.optim.lr=grid([0.02, 0.00001])",  # in this order; the second trails from its first evaluation
        "tune.num_samples=1",
        "tune.max_concurrent=1",  # one after the other: ASHA has the first trial's result when the second reports
        "train.epochs=2",
        "scaling.num_workers=1",
        "run.mlflow=true",
    )
    first = summary(run_job("tune", *sweep, timeout=600))
    assert (first["trials"], first["stopped_early"], first["errored"]) == (2, 1, 0), first
    assert first["best_values"] == {"optim.lr": 0.02} and first["best_metric"] >= 0.9
    rows = (tmp_path / "sweep" / "results.md").read_text().splitlines()
    assert rows[0] == "| trial | optim.lr | test_accuracy | steps | time (s) | stopped early |"
    assert [r.rsplit("|", 2)[-2].strip() for r in rows[2:]] == ["no", "yes"]
    assert (tmp_path / "sweep" / "plot.png").stat().st_size > 0
    # MLflow: the sweep, and the finished trial's job (the stopped one's logs only if it ends before Tune ends it)
    assert [r.info.run_name for r in mlflow_runs(tmp_path)] == ["sweep"]
    trials = {r.data.params["optim.lr"]: r.info.status for r in mlflow_runs(tmp_path / "sweep" / "trials")}
    assert trials["0.02"] == "FINISHED" and trials.get("1e-05", "KILLED") in ("FINISHED", "KILLED")
    # The best settings, as a config the strategy's job takes as it is
    best = yaml.safe_load((tmp_path / "sweep" / "best.yaml").read_text())
    assert best["optim"]["lr"] == 0.02 and "run" not in best and "tune" not in best
    shown = subprocess.run(
        [sys.executable, "-m", "raydist.cli", "config", "show", "--job", "sync", "--config",
         str(tmp_path / "sweep" / "best.yaml")], capture_output=True, text=True, cwd=REPO,
    )  # fmt: skip
    assert shown.returncode == 0 and "  lr: 0.02\n" in shown.stdout, shown.stderr
    # The same command again: the finished sweep is restored, no trial runs again
    again = run_job("tune", *sweep, timeout=600)
    assert summary(again)["best_values"] == first["best_values"]
    assert "[tune] restoring the sweep" in again.stdout
    logs = sorted((tmp_path / "sweep" / "trials").glob("*.log"))
    assert len(logs) == 2 and all(log.read_text().count('{"strategy": "sync"') <= 1 for log in logs)


def test_the_python_api_refuses_a_bad_space_before_ray_starts(tmp_path):
    import raydist

    with pytest.raises(ConfigError, match=r"^tune.space.optim.lr: needs low < high"):
        raydist.tune("sync", space={"optim.lr": "uniform(0.1, 0.01)"}, num_samples=2,
                     run={"storage_path": str(tmp_path)})  # fmt: skip
    ray = sys.modules.get("ray")
    assert ray is None or not ray.is_initialized()
    assert not (tmp_path / "tune-digits").exists()
