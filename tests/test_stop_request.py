"""A cluster-wide stop request (what the SLURM time-limit warning sends): every run checkpoints at a step boundary,
stops, and resumes exactly where it stopped. Real Ray head, real jobs; the SLURM end to end is in
test_slurm_resilience.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from jobutil import REPO, summary
from raydist.metrics import read_steps
from rayhead import ray_head

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head():
    with ray_head(num_cpus=3) as h:
        yield h


def _on_head(head, code: str) -> None:
    """Run `code` in a driver of its own on the head (the test process keeps out of Ray)."""
    script = f"import ray; ray.init(address={head.gcs_address!r}, logging_level='ERROR')\n{code}"
    subprocess.run([sys.executable, "-c", script], cwd=REPO, env=head.client_env(), check=True, timeout=60,
                   capture_output=True)


def _args(head, job: str, *overrides: str) -> list[str]:
    args = [sys.executable, str(REPO / "jobs" / f"{job}.py"), "--set", f"run.address={head.gcs_address}"]
    for o in overrides:
        args += ["--set", o]
    return args


def _job(head, job: str, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(_args(head, job, *overrides), cwd=REPO, env=head.client_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _run(head, job: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(_args(head, job, *overrides), cwd=REPO, env=head.client_env(), capture_output=True,
                          text=True, timeout=300)


def _stop_once_training(head, proc: subprocess.Popen, marker: str) -> subprocess.CompletedProcess:
    """Wait for the job's first progress line, ask the cluster to stop, and collect the job."""
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:
        lines.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    _on_head(head, "from raydist.preemption import request_stop; request_stop('test: time limit', None)")
    out, err = proc.communicate(timeout=120)
    _on_head(head, "from raydist.preemption import clear_stop; clear_stop()")
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(lines) + out, err)


def test_sync_run_stops_at_a_checkpoint_and_resumes_with_identical_losses(head, tmp_path):
    common = [f"run.storage_path={tmp_path}", "train.epochs=30", "scaling.num_workers=2", "model.dropout=0.2",
              "straggler.worker=0", "straggler.slowdown=3"]  # slower, so the stop lands mid-run
    stopped = summary(_stop_once_training(head, _job(head, "sync", *common, "run.name=resumed"), "[raydist] step"))
    assert stopped["status"] == "stopped" and "test: time limit" in stopped["stop_reason"], stopped
    assert 0 < stopped["steps"] < stopped["total_steps"] == 30 * 22
    assert stopped["checkpoint"].endswith(f"checkpoint_step{stopped['steps']:08d}")  # every step taken is saved

    resumed = summary(_run(head, "sync", *common, "run.name=resumed"))
    straight = summary(_run(head, "sync", *common, "run.name=straight"))
    assert resumed["resumed_from_step"] == stopped["steps"] and resumed["status"] == "completed", (stopped, resumed)
    assert resumed["steps"] == straight["steps"] == 30 * 22
    a, b = read_steps(straight["metrics_file"]), read_steps(resumed["metrics_file"])
    assert sorted(b) == sorted(a) == list(range(1, 30 * 22 + 1))
    for step in range(stopped["steps"] + 1, 30 * 22 + 1):
        assert b[step]["loss"] == a[step]["loss"], step


def test_async_ps_stops_with_its_servers_checkpointed_and_resumes_to_the_full_budget(head, tmp_path):
    common = [f"run.storage_path={tmp_path}", "run.name=ps", "train.epochs=30", "async_ps.num_servers=2",
              "straggler.worker=0", "straggler.slowdown=3"]
    stopped = summary(_stop_once_training(head, _job(head, "async", *common), "[raydist] async: step"))
    assert stopped["status"] == "stopped" and "test: time limit" in stopped["stop_reason"], stopped
    assert 0 < stopped["steps"] < stopped["total_steps"]
    assert stopped["checkpoint"].endswith(f"checkpoint_step{stopped['steps']:08d}")
    resumed = summary(_run(head, "async", *common))
    assert resumed["resumed_from_step"] == stopped["steps"] and resumed["status"] == "completed"
    assert resumed["steps"] == resumed["total_steps"] == stopped["total_steps"]  # the sample budget carried over
    records = read_steps(resumed["metrics_file"])
    assert sorted(records) == list(range(1, resumed["steps"] + 1))  # server versions carried on, none repeated
    assert json.loads((tmp_path / "ps" / "summary.json").read_text()) == resumed
