"""The async parameter server, jobs/async.py as users run it, on the shared Ray head (tests/support/sharedray.py), whose
warm interpreter forks its servers and workers: staleness, sharding, bounds, checkpoint and resume."""

from __future__ import annotations

import pytest
import torch

from raydist.observability.metrics import read_steps
from tests.support.boardutil import config_texts, read_board, scalar_steps
from tests.support.jobutil import refusal, run_job, summary


@pytest.fixture
def run_async(tmp_path):
    def run(name: str, *overrides: str) -> dict:
        return summary(run_job("async", f"run.storage_path={tmp_path}", f"run.name={name}", *overrides))

    return run


pytestmark = [pytest.mark.slow, pytest.mark.shared_ray]


@pytest.mark.parametrize("optimizer", ["optim.name=sgd", pytest.param("optim.name=adagrad", marks=pytest.mark.long)])
def test_one_worker_with_n_fetch_1_sees_no_staleness_and_sharding_changes_nothing(run_async, optimizer):
    from raydist.strategies.async_ps.checkpoints import load_params

    one = run_async("one", "scaling.num_workers=1", "train.max_steps=30", optimizer)
    three = run_async("three", "scaling.num_workers=1", "train.max_steps=30", "async_ps.num_servers=3", optimizer)
    for result in (one, three):
        assert result["steps"] == 30 and result["staleness_max"] == 0 and result["staleness_mean"] == 0
    assert three["servers"] == 3
    # Each shard applies the same optimizer to its own slice: the joined parameters match bit for bit.
    assert torch.equal(load_params(one["checkpoint"]), load_params(three["checkpoint"]))


def test_staleness_grows_with_n_fetch(run_async):
    # One worker fetching every 4th step pushes gradients 0, 1, 2, 3 versions old, again and again.
    fetch4 = run_async("fetch4", "scaling.num_workers=1", "train.max_steps=40", "async_ps.n_fetch=4")
    assert fetch4["staleness_mean"] == 1.5 and fetch4["staleness_max"] == 3


@pytest.mark.long
def test_staleness_grows_with_workers(run_async):
    """Long; in the suite, three workers' pushes are often 2 versions behind in the bound test's drop case."""
    # Three workers: while one computes, the other two push.
    workers3 = run_async("workers3", "scaling.num_workers=3", "train.max_steps=30")
    assert workers3["steps"] == 90 and workers3["staleness_mean"] > 0.5 and workers3["staleness_max"] >= 2
    assert len(workers3["bytes_per_worker"]) == len(workers3["wait_s_per_worker"]) == 3


@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_staleness_bound_holds_by_waiting_or_dropping(run_async, policy):
    result = run_async(
        policy,
        "scaling.num_workers=3",
        "train.max_steps=30",
        "async_ps.max_staleness=1",
        f"async_ps.on_stale={policy}",
        "async_ps.num_servers=2",
    )
    assert result["staleness_max"] <= 1
    assert result["steps"] == 90  # the sample budget is spent either way
    if policy == "wait":
        assert result["dropped"] == 0
    else:
        assert result["dropped"] > 0  # three workers pushing without waiting are often 2 versions behind


def test_stopped_run_resumes_from_the_servers_checkpoint(run_async, tmp_path):
    common = ["train.max_steps=30", "checkpoint.every_steps=10", "async_ps.staleness_lr=true"]
    stopped = run_async("resumed", *common, "train.stop_at_step=25")
    assert stopped["steps"] == 25 and stopped["checkpoint"].endswith("checkpoint_step00000025")
    assert stopped["status"] == "stopped" and stopped["stop_reason"] == "train.stop_at_step=25"
    resumed = run_async("resumed", *common)
    assert resumed["resumed_from_step"] == 25 and resumed["steps"] == 60
    assert sorted(read_steps(resumed["metrics_file"])) == list(range(1, 61))  # server versions carry on
    kept = sorted(p.name for p in (tmp_path / "resumed").glob("checkpoint_step*"))
    assert len(kept) == 2 and kept[-1] == "checkpoint_step00000060"  # checkpoint.keep=2
    # TensorBoard, from the driver: one point per server version over both sessions, evaluations at the stop and the
    # end (and at an epoch boundary if the driver polled there in time), one config text per session
    board = read_board(tmp_path / "resumed")
    assert scalar_steps(board, "train/loss") == scalar_steps(board, "train/staleness") == list(range(1, 61))
    evals = scalar_steps(board, "eval/test_accuracy")
    assert evals[0] == 25 and evals[-1] == 60 and evals == sorted(evals), evals
    assert sorted(config_texts(board)) == [0, 25]

    # Another shard count than the checkpoint's: refused as bad input, with one line
    line = refusal(
        "async",
        "--set",
        f"run.storage_path={tmp_path}",
        "--set",
        "run.name=resumed",
        *(a for o in common for a in ("--set", o)),
        "--set",
        "async_ps.num_servers=2",
    )
    assert "holds 1 server shards but async_ps.num_servers=2: keep the shard count or use a new run.name" in line, line


@pytest.mark.parametrize(
    "override, names",
    [
        ("async_ps.n_fetch=0", "async_ps.n_fetch"),
        ("async_ps.on_stale=later", "async_ps.on_stale"),
        ("straggler.worker=2", "straggler.worker"),
    ],
)
def test_bad_async_config_is_one_line_and_exit_2(override, names):
    assert names in refusal("async", "--set", override)
