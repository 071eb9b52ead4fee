"""Faults inside a run (Ray Train strategies): a desync is found and named, a stopped worker is named within the
bound; the decisions themselves as pure functions."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import time

import pytest

from raydist.train.desync import compare

# Ray Train's health check runs from the worker group's start, so a bound much under the seconds a loaded machine
# may spend importing torch in a worker (one CI run: 5 s) names a healthy worker hung before its first step.
HANG_TIMEOUT_S = 15
# SIGSTOP to exit: the timeout plus 12-14 s alone on 2 cores (the check's poll, the group's 5 s to leave its process
# group, Ray's teardown), with room for the suite's parallel load; under Ray's 30 s for that leave, which a
# controller on a cluster waited until its backend config carried the driver's 5 s, 51 s alone.
HANG_EXIT_BOUND_S = HANG_TIMEOUT_S + 30.0

# ---- the desync decision -------------------------------------------------------------------------------------------


def test_identical_replicas_pass():
    assert compare([1.0, 1.3, 0.7], [5.0, 5.0, 5.0], tol=1e-6, grad_tol=0) == []


def test_the_rank_that_differs_from_the_majority_is_named():
    (finding,) = compare([1.0] * 4, [5.0, 5.0, 5.001, 5.0], tol=1e-6, grad_tol=0)
    assert finding.ranks == [2] and finding.act and "rank 0's" in finding.what


def test_with_two_ranks_the_one_named_is_the_one_that_differs_from_rank_0():
    (finding,) = compare([1.0, 1.0], [5.0, 5.5], tol=1e-6, grad_tol=0)
    assert finding.ranks == [1]


def test_checksums_are_not_compared_where_replicas_may_differ():
    assert compare([1.0, 1.0], None, tol=1e-6, grad_tol=0) == []


def test_non_finite_values_are_named():
    findings = compare([1.0, math.nan, 1.0], [5.0, 5.0, math.inf], tol=1e-6, grad_tol=0)
    assert [(f.ranks, f.act) for f in findings] == [([1], True), ([2], True)]


def test_gradient_norm_spread_only_warns_and_only_when_asked():
    assert compare([1.0, 1.0, 2.0], [5.0] * 3, tol=1e-6, grad_tol=0) == []
    (finding,) = compare([1.0, 1.0, 2.0], [5.0] * 3, tol=1e-6, grad_tol=0.1)
    assert finding.ranks == [2] and not finding.act


# ---- real runs ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.shared_ray
def test_a_perturbed_rank_is_named_within_n_steps_and_the_run_fails_without_a_checkpoint_past_it(tmp_path):
    """Sync DDP: rank 1 nudges one weight after step 3; the check every 2 steps names rank 1 at step 4, the job
    exits 1 with that one line, and the newest checkpoint is the good one from step 2."""
    from tests.support.jobutil import run_job

    proc = run_job(
        "sync",
        f"run.storage_path={tmp_path}",
        "run.name=r",
        "train.max_steps=12",
        "checkpoint.every_steps=2",
        "faults.desync_every_steps=2",
        "faults.inject_desync_rank=1",
        "faults.inject_desync_step=3",
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines[-1].startswith(
        "raydist: error: training failed: desync at step 4: parameters of rank 1 differ from rank 0's"
    ), proc.stderr[-3000:]
    assert "no checkpoint written after step 2" in lines[-1]
    assert json.loads((tmp_path / "r" / "failure.json").read_text())["reason"] in lines[-1]
    assert sorted(p.name for p in (tmp_path / "r").glob("checkpoint_step*")) == ["checkpoint_step00000002"]
    assert not (tmp_path / "r" / "summary.json").exists()


@pytest.mark.slow
@pytest.mark.shared_ray
def test_restart_on_desync_resumes_from_the_last_checkpoint_and_completes(tmp_path):
    """Local SGD in its synchronous warm-up (replicas must agree every step): with on_desync=restart the workers
    restart from step 2's checkpoint, the perturbation is not repeated, and the run completes."""
    from tests.support.jobutil import run_job, summary

    proc = run_job(
        "local_sgd",
        f"run.storage_path={tmp_path}",
        "run.name=r",
        "train.max_steps=10",
        "local_sgd.warmup_sync_steps=10",
        "checkpoint.every_steps=2",
        "faults.desync_every_steps=2",
        "faults.inject_desync_rank=1",
        "faults.inject_desync_step=3",
        "faults.on_desync=restart",
        "scaling.max_failures=1",
    )
    s = summary(proc)
    assert "desync at step 4: parameters of rank 1 differ" in proc.stdout
    assert s["status"] == "completed" and s["steps"] == 10 and s["resumed_from_step"] == 2


@pytest.mark.slow
@pytest.mark.shared_ray
def test_a_stopped_worker_fails_the_run_within_the_bound_naming_its_rank_and_node(tmp_path):
    """SIGSTOP one training worker mid-run: within faults.hang_timeout_s (plus Ray's teardown) the job exits 1
    with one line naming that worker's rank, node and pid, instead of hanging in the next all-reduce."""
    from tests.support.jobutil import job_processes_titled, start_job, wait_for_steps

    proc = start_job(
        "sync",
        f"run.storage_path={tmp_path}",
        "run.name=r",
        "train.max_steps=1000000",
        "checkpoint.every_steps=100000",
        f"faults.hang_timeout_s={HANG_TIMEOUT_S}",
        "scaling.max_failures=0",
    )
    victim = None
    try:
        wait_for_steps(tmp_path / "r" / "metrics.jsonl", 20, proc)
        workers = job_processes_titled(proc, "ray::RayTrainWorker")
        assert len(workers) == 2, workers
        victim = workers[-1]
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, err = proc.communicate(timeout=180)
        took = time.monotonic() - stopped_at
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)  # Ray kills it; never leave a stopped process behind
            except ProcessLookupError:
                pass
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1, err[-3000:]
    assert f"(pid {victim}) stopped answering" in last and f"faults.hang_timeout_s={HANG_TIMEOUT_S}" in last, last
    assert f"on node {os.uname().nodename} " in last and "rank " in last, last
    print(f"hang to exit: {took:.1f} s")
    assert took < HANG_EXIT_BOUND_S, f"the job took {took:.0f} s to fail after the stop"


@pytest.mark.slow
@pytest.mark.shared_ray
def test_worker_sigkills_at_random_moments_cost_no_step_and_no_accuracy(tmp_path):
    """benchmarks/train_chaos.py, short: two SIGKILLs of random training workers; Ray Train restarts the group
    from the last checkpoint each time and the run completes every step with the undisturbed run's accuracy."""
    from tests.support.jobutil import load_benchmark

    chaos = load_benchmark("train_chaos")
    short = ["train.epochs=6"]
    calm = chaos.run(str(tmp_path), "calm", 0, seed=0, overrides=short)
    hit = chaos.run(str(tmp_path), "chaos", 2, seed=0, overrides=short)
    assert hit["kills"] == 2
    assert hit["status"] == "completed" and hit["steps"] == hit["total_steps"] == calm["total_steps"]
    assert abs(hit["test_accuracy"] - calm["test_accuracy"]) <= 0.01, (hit, calm)
    assert calm["restarts"] == 0 and hit["restarts"] == 2, (hit, calm)  # each kill: one restart from a checkpoint
    assert not hit["traceback"], (
        f"a restart put a traceback on the console (one line says what happened):\n{hit.get('traceback_context')}"
    )


KILL_THE_CONTROLLER = """
import json, os, signal, sys, threading, time
from pathlib import Path
import ray
from ray.util.placement_group import PlacementGroup
import raydist

noted = Path(sys.argv[1]) / "k" / "placement_group.json"
group = {}

def kill_the_controller():
    while not noted.exists():
        time.sleep(0.1)
    group["id"] = json.loads(noted.read_text())["id"]
    from ray.util.state import list_actors
    (controller,) = list_actors(filters=[("class_name", "=", "TrainController"), ("state", "=", "ALIVE")])
    os.kill(controller.pid, signal.SIGKILL)

ray.init()  # the user's own connection, which raydist.fit leaves open: the job lives on after the fit
threading.Thread(target=kill_the_controller, daemon=True).start()
try:
    raydist.fit("sync", train={"epochs": 200}, run={"storage_path": sys.argv[1], "name": "k"})
except BaseException as e:
    print(f"fit failed: {type(e).__name__}: {e}", file=sys.stderr)
# one write, on a line of its own: Ray's log thread prints to the same stdout ("(raylet) A worker died ...")
sys.stdout.write("placement group: " + json.dumps(ray.util.placement_group_table(
    PlacementGroup(ray.PlacementGroupID.from_hex(group["id"])))) + "\\n")
"""


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.shared_ray
def test_a_driver_that_lives_on_after_its_controller_was_killed_gets_the_workers_cpus_back(tmp_path):
    """Ray removes a worker group's placement group once both its creator (Ray Train's controller) and its job are
    gone; raydist starts no PlacementGroupCleaner (raydist.engines.raytrain_trainer), so its driver removes the group itself
    when fit() fails: a Python API user who called ray.init() (whose job outlives the fit) finds the CPUs free."""
    import sys

    from tests.support.jobutil import REPO, clean_env

    proc = subprocess.run(
        [sys.executable, "-c", KILL_THE_CONTROLLER, str(tmp_path)],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "fit failed: RaydistError: training failed" in proc.stderr, proc.stderr[-3000:]
    table = [ln for ln in proc.stdout.splitlines() if ln.startswith("placement group: ")]
    assert table and json.loads(table[-1].split(": ", 1)[1])["state"] == "REMOVED", proc.stdout[-2000:]
    assert not (tmp_path / "k" / "placement_group.json").exists()
