"""Straggler injection: the policy, and its effect on sync DDP (everyone waits) against the async PS (nobody does)."""

from __future__ import annotations

import pytest

from jobutil import run_job, summary
from raydist.config import StragglerConfig
from raydist.straggler import delay_s


def test_only_the_named_worker_sleeps_in_proportion_to_its_own_step_time():
    cfg = StragglerConfig(worker=1, slowdown=3.0, pause_at_step=5, pause_s=2.0)
    assert delay_s(cfg, rank=0, step=5, step_time_s=0.1) == 0.0
    assert delay_s(cfg, rank=1, step=4, step_time_s=0.1) == pytest.approx(0.2)  # 3x slower: 2 extra step times
    assert delay_s(cfg, rank=1, step=5, step_time_s=0.1) == pytest.approx(2.2)  # plus the one-off pause
    assert delay_s(StragglerConfig(), rank=0, step=1, step_time_s=1.0) == 0.0  # off by default


@pytest.mark.slow
def test_a_3x_straggler_slows_sync_ddp_but_not_the_async_ps(tmp_path):
    # 3 workers on this machine's 2 cores; samples/s is each job's training-loop throughput (set-up excluded).
    common = [f"run.storage_path={tmp_path}", "scaling.num_workers=3", "train.epochs=20"]
    straggle = ["straggler.worker=2", "straggler.slowdown=3"]
    slowdown = {}
    for job in ("sync", "async"):
        base = summary(run_job(job, *common, f"run.name={job}-base"))
        slow = summary(run_job(job, *common, *straggle, f"run.name={job}-slow"))
        slowdown[job] = base["samples_per_s"] / slow["samples_per_s"]
        if job == "sync":  # the fast workers' waiting is where the time goes
            assert min(slow["wait_s_per_worker"][:2]) > 2 * slow["wait_s_per_worker"][2], slow
    # Measured side by side: sync waits for the slow worker every step (~2.3x measured), the async PS barely
    # (~1.1x alone, 1.4x with the machine busy); what the user relies on is that sync suffers far more.
    assert slowdown["sync"] > 1.5, slowdown
    assert slowdown["async"] < 0.75 * slowdown["sync"], slowdown
