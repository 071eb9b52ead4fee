"""Your own model and data, which raydist has never seen (examples/tinygpt: a GPT-style model on synthetic tokens),
given only by import path, or through the Python API, or as an unmodified script: run from examples/, as a user
runs them from their project."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.jobutil import REPO, clean_env, summary, tinygpt_job

EXAMPLES = REPO / "examples"
SHORT = ["train.max_steps=16", "train.report_every_s=0.2"]


def job(name: str, storage, *overrides: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return tinygpt_job(name, *SHORT, f"run.storage_path={storage}", *overrides, timeout=timeout)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.shared_ray
def test_compare_trains_your_model_side_by_side(tmp_path):
    """compare takes your model as each strategy's job does (it starts them as `python -m raydist.job`, your
    factories among the shared settings): two strategies show it, heal among them, which only this test trains on
    your model. Every other strategy trains it above chance in test_your_model_resumes_at_the_exact_step, and
    compare's own tests (tests/support/comparerun.py) run three strategies side by side on digits."""
    out = summary(
        job("compare", tmp_path, "compare.strategies=sync,heal", f"compare.output_dir={tmp_path / 'cmp'}", timeout=900)
    )
    results = json.loads((tmp_path / "cmp" / "results.json").read_text())["strategies"]
    assert list(results) == ["sync", "heal"]
    for name, r in results.items():
        s = r["summary"]
        assert s["status"] == "completed" and s["run_name"] == name, s
        assert s["test_accuracy"] > 1 / 64, (name, s["test_accuracy"])  # per-token accuracy, above chance
    table = (tmp_path / "cmp" / "results.md").read_text()
    assert all(label in table for label in ("sync DDP", "heal (torchft)"))
    assert results["heal"]["summary"]["heals"] == 0  # torchft's quorum trained your model; nothing failed
    assert (tmp_path / "cmp" / "plot.png").stat().st_size > 0 and set(out["test_accuracy"]) == set(results)


@pytest.mark.slow
# Local SGD's in the suite (its digits resume is a long scenario); sync's, the async PS's and FSDP's are long
# scenarios (benchmarks/long_tests.py), their resumes on digits in the suite (test_sync_job, test_async_ps,
# test_fsdp)
@pytest.mark.parametrize(
    "strategy", [*(pytest.param(s, marks=pytest.mark.long) for s in ("sync", "async", "fsdp")), "local_sgd"]
)
@pytest.mark.shared_ray
def test_your_model_resumes_at_the_exact_step(tmp_path, strategy):
    stopped = summary(job(strategy, tmp_path, "train.stop_at_step=8"))
    assert stopped["status"] == "stopped" and stopped["run_name"] == f"{strategy}-tinygpt", stopped
    resumed = summary(job(strategy, tmp_path))
    assert resumed["status"] == "completed" and resumed["steps"] == resumed["total_steps"], resumed
    assert resumed["test_accuracy"] > 1 / 64, resumed  # per-token accuracy, above chance: it learned your task
    # async counts every worker's gradient updates and stops at the first checkpoint at or after the step
    assert resumed["resumed_from_step"] == stopped["steps"] and (strategy == "async" or stopped["steps"] == 8)


API_RUN = """
import json, sys
import raydist
from tinygpt.data import make_datasets
from tinygpt.model import make_model
summary = raydist.fit("local_sgd", model=make_model, data=make_datasets, config="tinygpt/tinygpt.yaml",
                      train={"max_steps": 16, "report_every_s": 0.2}, run={"storage_path": sys.argv[1], "name": "api"})
print(json.dumps(summary.to_dict()))
"""
# What depends on timing (final_loss too: the mean over the steps since the last report, which comes by the clock)
# or on the run's name; everything else must be equal: the same steps, the same test loss and accuracy.
TIMING = {
    "wall_s",
    "train_time_s",
    "samples_per_s",
    "steps_per_s",
    "startup_s",
    "wait_s_per_worker",
    "peak_memory_bytes_per_worker",
    "final_loss",
    "run_name",
    "run_dir",
    "checkpoint",
    "metrics_file",
}


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.shared_ray
def test_the_python_api_returns_what_the_job_script_returns(tmp_path):
    by_script = summary(job("local_sgd", tmp_path, "run.name=script"))
    proc = subprocess.run(
        [sys.executable, "-c", API_RUN, str(tmp_path)],
        cwd=EXAMPLES,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    by_api = summary(proc)
    assert by_api["run_name"] == "api" and by_api["status"] == "completed" and by_api["test_loss"] is not None
    assert {k: v for k, v in by_api.items() if k not in TIMING} == {
        k: v for k, v in by_script.items() if k not in TIMING
    }


@pytest.mark.slow
@pytest.mark.shared_ray  # its ranks forked by the head's warm interpreter, as on a cluster; test_launch's run embedded
def test_the_example_script_runs_unmodified_under_raydist_launch(tmp_path):
    proc = subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "raydist"),
            "launch",
            "--workers",
            "2",
            "--storage",
            str(tmp_path),
            "--",
            sys.executable,
            "-m",
            "tinygpt.train",
            "--steps",
            "24",
        ],
        cwd=EXAMPLES,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    done = [ln for ln in proc.stdout.splitlines() if "test next-token accuracy" in ln]
    assert done and float(done[-1].rsplit(" ", 1)[1]) > 1 / 64, proc.stdout[-2000:]


def test_functions_become_import_paths_the_workers_can_import():
    sys.path.insert(0, str(EXAMPLES))
    from tinygpt.model import TinyGPT, make_model

    from raydist.api import import_path_of
    from raydist.errors import UsageError

    assert import_path_of(make_model, "model") == "tinygpt.model:make_model"
    assert import_path_of(TinyGPT, "model") == "tinygpt.model:TinyGPT"
    assert import_path_of("pkg.mod:fn", "model") == "pkg.mod:fn"
    with pytest.raises(UsageError, match="cannot be imported back"):
        import_path_of(lambda: None, "model")


REGRESSION = """
import torch

def make_datasets(samples=512):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    data = torch.utils.data.TensorDataset(x[:, :], y)
    return torch.utils.data.Subset(data, range(0, samples - 128)), torch.utils.data.Subset(data, range(samples - 128, samples))

def make_model():
    return torch.nn.Linear(4, 1)

def mse(output, target):
    return torch.nn.functional.mse_loss(output.squeeze(-1), target)
"""


@pytest.mark.slow
@pytest.mark.shared_ray
def test_a_regression_with_its_own_loss_trains_and_reports_no_accuracy(tmp_path):
    (tmp_path / "regress.py").write_text(REGRESSION)
    args = [
        sys.executable,
        "-m",
        "raydist.job",
        "sync",
        "--set",
        "model.factory=regress:make_model",
        "--set",
        "data.factory=regress:make_datasets",
        "--set",
        "train.loss=regress:mse",
        "--set",
        "train.max_steps=100",
        "--set",
        "optim.lr=0.1",
        "--set",
        "schedule.name=constant",
        "--set",
        "schedule.warmup_steps=0",
        "--set",
        f"run.storage_path={tmp_path / 'runs'}",
    ]
    s = summary(subprocess.run(args, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=400))
    assert s["status"] == "completed" and s["test_accuracy"] is None and s["run_name"] == "sync-regress"
    assert s["test_loss"] < 1.0, s["test_loss"]  # the variance of y is 14.25: it learned the linear map
