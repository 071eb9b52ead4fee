"""The async PS replaces SIGKILLed server shards and workers within scaling.max_failures: real jobs, real kills.

The jobs run as subprocesses on the shared Ray head (tests/sharedray.py), one at a time; the kills go to the
processes Ray titled `ray::ParameterShard` / `ray::DownpourWorker` among the head's descendants. benchmarks/ps_chaos.py
runs the long version, three kills of each, beside an undisturbed run, each on an embedded instance of its own: the
accuracy these tests hold the killed run to is the one it stored.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from jobutil import REPO, load_benchmark
from raydist.observability.metrics import read_steps

pytestmark = [pytest.mark.slow, pytest.mark.shared_ray]


chaos = load_benchmark("ps_chaos")


# The undisturbed run's accuracy as benchmarks/ps_chaos.py stored it (the benchmark runs one beside its chaos run:
# undisturbed runs of this config agree within 0.002); the kills may cost no more than 0.01 of it.
UNDISTURBED_ACCURACY = json.loads((REPO / "docs/data/ps_chaos.json").read_text())["undisturbed"]["test_accuracy"]


def test_killed_server_and_worker_are_replaced_and_the_run_spends_its_whole_budget(tmp_path):
    job = chaos.Job(tmp_path, "chaos", chaos.CONFIG)  # scaling.max_failures: the default 3
    try:
        kills = chaos.chaos(job, ["server", "worker"], seed=1)
        code, result = job.finish()
    finally:
        job.stop()
    assert code == 0, job.stderr()[-3000:]
    assert [k.named.rsplit(" ", 1)[0] for k in kills] == ["server shard", "worker"]
    assert result["status"] == "completed" and result["restarts"] == 2
    assert result["steps"] == result["total_steps"] == sum(result["steps_per_worker"])  # the whole budget, once
    # Every step has its record; a recomputed step's record replaced the one written before the kill.
    assert sorted(read_steps(result["metrics_file"])) == list(range(1, result["total_steps"] + 1))
    assert result["test_accuracy"] >= UNDISTURBED_ACCURACY - 0.01, (result, UNDISTURBED_ACCURACY)


def test_a_kill_beyond_max_failures_fails_the_run_with_one_line_naming_the_actor(tmp_path):
    job = chaos.Job(tmp_path, "fragile", [*chaos.CONFIG, "scaling.max_failures=0"])
    try:
        job.wait_until("a checkpoint", lambda: job.newest_checkpoint() > 0)
        worker = job.wait_until("a worker", lambda: job.titled("worker"))[0]
        os.kill(worker, signal.SIGKILL)
        code, _ = job.finish()
    finally:
        job.stop()
    stderr = job.stderr()
    errors = [ln for ln in stderr.splitlines() if ln.startswith("raydist: error:")]
    assert code == 1 and len(errors) == 1 and stderr.rstrip().endswith(errors[0]), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert errors[0].startswith("raydist: error: training failed: worker ")
    assert "died (its worker process has died)" in errors[0] and "scaling.max_failures=0" in errors[0], errors[0]
    assert "restarting" not in job.stdout()


def test_a_stopped_shard_and_a_stopped_worker_are_replaced_within_the_bound(tmp_path):
    """SIGSTOP (not a death: Ray reports nothing) of a server shard, then of a worker: each is named within
    faults.hang_timeout_s, every actor restarts from the last checkpoint, and the run completes its budget."""
    job = chaos.Job(tmp_path, "frozen", [*chaos.CONFIG, "faults.hang_timeout_s=5", "scaling.max_failures=2"])
    stopped: list[int] = []
    try:
        for n, role in enumerate(["server", "worker"]):
            job.wait_until("a checkpoint after the last start",
                           lambda: job.newest_checkpoint() > max([int(m["step"] or 0) for m in job.restarts()] or [0]))
            victim = job.wait_until(f"a {role}", lambda: job.titled(role))[0]
            os.kill(victim, signal.SIGSTOP)
            stopped.append(victim)
            job.wait_until(f"restart {n + 1}", lambda: len(job.restarts()) > n, timeout=120)
        code, result = job.finish()
    finally:
        for pid in stopped:  # Ray kills them on restart; never leave a stopped process behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        job.stop()
    assert code == 0, job.stderr()[-3000:]
    lines = [m.group(0) for m in job.restarts()]
    assert [m["who"].rsplit(" ", 1)[0] for m in job.restarts()] == ["server shard", "worker"], lines
    assert all("stopped answering" in ln and "faults.hang_timeout_s=5" in ln for ln in lines), lines
    assert result["status"] == "completed" and result["steps"] == result["total_steps"] and result["restarts"] == 2
