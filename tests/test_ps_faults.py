"""The async PS replaces SIGKILLed server shards and workers within scaling.max_failures: real jobs, real kills.

The jobs run as subprocesses on the shared Ray head (tests/support/sharedray.py), one at a time; the kills go to the
processes Ray titled `ray::ParameterShard` / `ray::DownpourWorker` among the head's descendants. benchmarks/ps_chaos.py
runs the long version, three kills of each, beside an undisturbed run, each on an embedded instance of its own, and
holds the killed run to the undisturbed run's accuracy.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from raydist.observability.metrics import read_steps
from tests.support.jobutil import SHARED_RAY, load_benchmark

pytestmark = [pytest.mark.slow, pytest.mark.shared_ray]


chaos = load_benchmark("ps_chaos")


# What the killed run must still learn: a bar, not a baseline read from a stored run. The side-by-side comparison
# with an undisturbed run of the same config (the kills may cost no more than 0.01 of its accuracy) is
# benchmarks/ps_chaos.py's, which runs both at the same commit.
LEARNS = 0.93


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
    assert result["test_accuracy"] >= LEARNS, result


@pytest.mark.long
def test_a_kill_beyond_max_failures_fails_the_run_with_one_line_naming_the_actor(tmp_path):
    """Long; in the suite, test_ps_policy words the line and decides against the restart, and the kills above are
    seen and acted on by the same driver."""
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


@pytest.mark.long
def test_a_stopped_shard_and_a_stopped_worker_are_replaced_within_the_bound(tmp_path):
    """SIGSTOP (not a death: Ray reports nothing) of a server shard, then of a worker: each is named within
    faults.hang_timeout_s, every actor restarts from the last checkpoint, and the run completes its budget."""
    job = chaos.Job(tmp_path, "frozen", [*chaos.CONFIG, "faults.hang_timeout_s=5", "scaling.max_failures=2"])
    stopped: list[int] = []
    try:
        for n, role in enumerate(["server", "worker"]):
            job.wait_until(
                "a checkpoint after the last start",
                lambda: job.newest_checkpoint() > max([int(m["step"] or 0) for m in job.restarts()] or [0]),
            )
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


def _alive_actor_pid(name: str) -> int | None:
    """The pid of the live actor called `name` on the shared head, from Ray's state API (which shard a process
    holds shows in no process title)."""
    import urllib.parse

    from raydist.cluster.dashboard_client import get_json
    from tests.support import sharedray

    head = sharedray.head()
    query = urllib.parse.urlencode(
        {"filter_keys": "name", "filter_predicates": "=", "filter_values": name, "detail": "true", "limit": 100}
    )
    answer = get_json(
        f"{head.dashboard_url}/api/v0/actors?{query}", Path(head.token_path).read_text().strip(), timeout=20
    )
    pids = [a["pid"] for a in answer["data"]["result"]["result"] if a["state"] == "ALIVE" and a.get("pid")]
    return pids[0] if pids else None


def test_a_shard_stopped_while_a_checkpoint_is_due_is_named_within_the_bound(tmp_path):
    """A checkpoint at every step while shard 1 is stopped: shard 0 still hands the driver the workers' steps, so a
    checkpoint comes due, and it asks every shard for its state. That call is bounded by faults.hang_timeout_s too
    (it once waited for ever, the watchdog with it): the stop is named and the run restarts from a checkpoint."""
    if not SHARED_RAY:
        pytest.skip("finds shard 1 through the shared head's state API")
    job = chaos.Job(tmp_path, "due", [*chaos.CONFIG, "faults.hang_timeout_s=5", "checkpoint.every_steps=1"])
    victim = None
    try:
        job.wait_until("a checkpoint", lambda: job.newest_checkpoint() > 0)
        victim = job.wait_until("shard 1", lambda: _alive_actor_pid("raydist/due/server-1"))
        os.kill(victim, signal.SIGSTOP)
        job.wait_until("a restart", job.restarts, timeout=120)
    finally:
        try:
            if victim is not None:
                os.kill(victim, signal.SIGKILL)  # Ray kills it on restart; never leave a stopped process behind
        except ProcessLookupError:
            pass
        job.stop()
    lines = [m.group(0) for m in job.restarts()]
    assert job.restarts()[0]["who"] == "server shard 1", lines
    assert "stopped answering (no answer for 5 s, faults.hang_timeout_s=5)" in lines[0], lines
    assert "restarting servers and workers from checkpoint step" in lines[0], lines
