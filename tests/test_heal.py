"""The heal strategy (torchft through Ray Train): a SIGKILLed worker is replaced while the other keeps training, the
replacement takes the state from its peer, and the run completes its whole step budget without a checkpoint restart;
an elastic heal run that loses a node starts again on the workers that fit. Its books (`HealBook`), the restart
policy and the loop's collectives over a sum-only group are checked on their own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raydist.strategies.heal.worker import HealBook
from raydist.train.collectives import SumOnlyCollectives
from tests.support.jobutil import REPO, clean_env


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_failure_and_the_replacements_return_make_one_heal_with_its_steps_and_seconds():
    clock = Clock()
    book = HealBook(2, clock)
    for step in range(1, 4):  # whole
        clock.t += 0.1
        assert book.step(True, 2, step) is None
    clock.t += 0.5
    news = book.step(False, 2, 3)  # a peer died in this step: not committed
    assert news and "failed" in news
    for step in range(4, 7):  # the survivor alone
        clock.t += 0.1
        book.step(True, 1, step)
    clock.t += 2.0
    news = book.step(True, 2, 7)  # the replacement is in
    assert news and news.startswith("healed at step 7")
    [(steps, seconds, stall)] = book.heals
    assert steps == 3 and seconds == pytest.approx(2.8) and stall == pytest.approx(0.6)


def test_a_replica_that_starts_alone_is_not_a_heal():
    book = HealBook(2, Clock())
    book.step(True, 1, 1)
    book.step(True, 2, 2)
    assert book.heals == []


class _Gloo(SumOnlyCollectives):
    def _sum(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)


def _gather(rank: int, port: int, out) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    coll = _Gloo(2, rank)
    out.put((rank, coll.all_gather_object({"rank": rank, "blob": "x" * (10 + 300 * rank)})))
    coll.barrier()
    dist.destroy_process_group()


def test_objects_are_gathered_in_rank_order_over_a_group_that_only_sums():
    from raydist.cluster.listen_port import free_port

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_gather, args=(free_port("127.0.0.1"), out), nprocs=2, start_method="spawn")
    for _ in range(2):
        rank, every = out.get()
        assert [e["rank"] for e in every] == [0, 1] and len(every[1]["blob"]) == 310


@pytest.mark.parametrize(
    "setting, words",
    [
        ("scaling.num_workers=1", "with one worker there is no peer to heal from"),
        ("scaling.num_workers=2", None),
        ("scaling.num_workers=2-3", None),
    ],
)
def test_where_heal_cannot_run_the_job_runs_as_sync_and_says_why(setting, words):
    from raydist import registry
    from raydist.config import load_config

    cfg = load_config(None, [], [setting], job="heal")
    job, why = registry.runnable("heal", cfg)
    assert (job, why) == ("heal", None) if words is None else (job == "sync" and words in why), (job, why)


def test_without_torchft_heal_falls_back_to_sync(monkeypatch):
    import importlib.util

    from raydist.config import load_config
    from raydist.strategies.heal import checks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchft" else real(name, *a))
    assert "pip install 'raydist[heal]'" in checks.why_not_heal(load_config(None, [], [], job="heal"))


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.shared_ray
def test_a_single_worker_heal_job_trains_as_sync_after_one_line(tmp_path):
    """Long; in the suite, the same choice and its line (test_where_heal_cannot_run_the_job_runs_as_sync_...), and
    sync's runs."""
    proc = subprocess.run(
        [
            sys.executable,
            "jobs/heal.py",
            "--set",
            "scaling.num_workers=1",
            "--set",
            "train.max_steps=20",
            "--set",
            f"run.storage_path={tmp_path}",
        ],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["strategy"] == "sync" and summary["status"] == "completed", summary
    said = [ln for ln in proc.stderr.splitlines() if "no peer to heal from" in ln]
    assert said == [
        "[raydist] scaling.num_workers=1: with one worker there is no peer to heal from: training with "
        "sync, which restarts from checkpoints, instead"
    ], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.shared_ray
def test_a_killed_worker_is_replaced_while_the_other_trains_and_the_run_completes_without_a_restart(tmp_path):
    """benchmarks/heal_vs_restart.py, short: heal with one SIGKILL of a random worker."""
    from tests.support.jobutil import load_benchmark

    bench = load_benchmark("heal_vs_restart")
    hit = bench.run(str(tmp_path), "healed", "heal", kills=1, seed=0, overrides=["train.epochs=6"])
    assert hit["kills"] == 1
    assert hit["status"] == "completed" and hit["steps"] == hit["total_steps"] == 132, hit
    # no checkpoint was read: the group never restarted, and the replacement took its state from its peer
    assert hit["restarts"] == 0 and hit["resumed_from_step"] is None and hit["steps_redone"] == 0, hit
    # At least the one heal, as in test_slurm_resilience: under load a live replica whose heartbeats lag past
    # heal.heartbeat_timeout_s is left out of a step and heals from its peer too (CI once saw 2 heals for 1 kill;
    # 3 busy loops at nice -5 on this 2-core machine gave 3, two of them before the kill), which is recovery working.
    assert hit["heals"] >= 1 and hit["joined_from_peer"] == 1 and hit["test_accuracy"] >= 0.9, hit
    assert len(hit["heal_s"]) == hit["heals"] == len(hit["heal_stall_s"]), hit
    heals = list(zip(hit["heal_stall_s"], hit["heal_s"], hit["steps_during_heals"]))
    assert all(stall <= took for stall, took, _ in heals), hit
    # the kill's heal: the survivor trained on while the killed worker was replaced
    assert any(stall < took and steps > 0 for stall, took, steps in heals), hit
    assert any("healed at step" in ln for ln in hit["heal_lines"]), hit["heal_lines"]
    assert not hit["traceback"], "a heal put a traceback on the console"


def _records(run_dir) -> list[dict]:
    try:
        return [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines() if r.strip()]
    except (OSError, ValueError):  # not yet, or a line half written
        return []


def _trained_past(run_dir, step: int) -> bool:
    return any(r.get("step", 0) > step for r in _records(run_dir))


@pytest.fixture
def warm_interpreter(monkeypatch):
    """One warm interpreter for the raylets a test starts on this machine (each Ray job's workers are forked per
    raylet: raydist.warm.request.ray_job_of), as the SLURM bring-up starts one per node: set in this process's environment,
    which the raylets and the job's driver inherit."""
    import os
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from raydist.warm.client import NO_PRESTART, WARM_ENV, WARM_EXEC, WARM_EXEC_ENV, WARM_LOG, start_server

    temp = Path(tempfile.mkdtemp(prefix="rdw-", dir="/tmp"))  # short: a unix socket path fits 107 bytes
    sock = temp / "warm.sock"
    for key, value in {WARM_ENV: str(sock), WARM_EXEC_ENV: str(WARM_EXEC), **NO_PRESTART}.items():
        monkeypatch.setenv(key, value)
    server = start_server(dict(os.environ), sock, temp / WARM_LOG, parent=os.getpid())
    assert server is not None
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert server.poll() is None and time.monotonic() < deadline, (temp / WARM_LOG).read_text()
        time.sleep(0.05)
    yield temp / WARM_LOG
    server.terminate()  # it ends once the workers it forked have
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.long
@pytest.mark.slow
def test_an_elastic_heal_run_that_loses_a_node_continues_on_the_workers_that_fit(tmp_path, warm_interpreter):
    """A Ray cluster of three one-CPU nodes (Ray's own multi-node cluster on one machine: a raylet each, their
    jobs' Ray workers forked by one warm interpreter), heal over scaling.num_workers=2-3, and one worker's node
    SIGKILLed past the first checkpoint. Ray Train cannot replace that replica in place; the run starts again on
    the two workers that fit, from the checkpoint, says so in one line, and completes its step budget.

    The node dies while rank 2 pauses after step 26 (straggler.pause_at_step), so every rank waits at that step:
    the rest of the 56 steps take under a second here, less than Ray needs to notice the dead node, and a node
    killed while they ran lost the race under load (the run completed on three). Rank 2 exists only in the
    three-worker run, so the resumed run does not pause."""
    import time

    from ray.cluster_utils import Cluster

    # Ray notices the dead node in about 2 s, not 15 (health checks every 0.5 s, 4 missed).
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
        },
    )
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(3)]
        cluster.wait_for_nodes()
        run_dir = tmp_path / "lost"
        proc = subprocess.Popen(
            [
                sys.executable,
                "jobs/heal.py",
                *(
                    a
                    for o in (
                        "scaling.num_workers=2-3",
                        f"run.storage_path={tmp_path}",
                        "run.name=lost",
                        "train.epochs=4",
                        "checkpoint.every_steps=20",
                        "scaling.node_loss_timeout_s=20",
                        "scaling.max_failures=4",
                        "straggler.worker=2",
                        "straggler.pause_at_step=26",
                        "straggler.pause_s=60",
                    )
                    for a in ("--set", o)
                ),
            ],
            cwd=REPO,
            env=clean_env(RAY_ADDRESS=cluster.address),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 240
        while not _trained_past(run_dir, 24):  # step 25 written: every rank is at step 26, where rank 2 pauses
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:]
            time.sleep(0.1)
        sizes = [r["world_size"] for r in _records(run_dir) if "session_at_step" in r]
        # Ray Train's elastic policy starts on the CPUs its coordinator reserved at that moment: two here once in CI
        # (then no rank 2 paused and the node's death changed nothing). Said as such, not as a missing resume.
        assert sizes[:1] == [3], f"Ray Train started the run on {sizes} workers, not on the three nodes"
        cluster.remove_node(nodes[-1], allow_graceful=False)
        out = proc.communicate(timeout=400)[0]
    finally:
        if "proc" in locals() and proc.poll() is None:
            proc.kill()
        cluster.shutdown()
    assert proc.returncode == 0, out[-5000:]
    # the file, not the last line: the test cluster's own processes may print after it (Ray's warning that it
    # sees other Ray instances on this machine, when the SLURM tests run beside this one)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["strategy"] == "heal" and summary["status"] == "completed", summary
    assert summary["workers"] == 2 and summary["steps"] == summary["total_steps"], summary
    assert summary["resumed_from_step"] is not None and summary["resumed_from_step"] >= 20, summary
    said = [ln for ln in out.splitlines() if "their replica cannot be replaced in place" in ln]
    assert said and said[0].startswith("[raydist] node(s) died:"), out[-5000:]
    at = out.find("Traceback")
    assert at < 0, out[max(0, at - 1500) : at + 3500]
    assert "torchft::lighthouse" not in out, out[-5000:]
    assert (run_dir / "lighthouse.log").exists()  # where torchft's log went instead
    assert "imported Ray for Ray job" in warm_interpreter.read_text()  # the raylets' workers were forked


def test_an_elastic_in_place_run_that_lost_a_node_starts_again_within_its_failure_budget():
    from raydist.config import load_config
    from raydist.engines.raytrain import failure_line, refit_after_node_loss

    lost = ["node02 (192.168.20.17): no heartbeat"]
    elastic = load_config(None, [], ["scaling.num_workers=2-3", "scaling.max_failures=2"], job="heal")
    first = refit_after_node_loss(elastic, lost, True, 0)
    assert first.startswith("[raydist] node(s) died: node02 (192.168.20.17)") and "2 to 3 workers" in first
    assert "did not fit yet" in refit_after_node_loss(elastic, lost, True, 1)
    assert refit_after_node_loss(elastic, lost, True, 2) is None  # the budget is spent
    assert refit_after_node_loss(elastic, [], True, 0) is None  # no node died: a failure like any other
    assert refit_after_node_loss(elastic, lost, False, 0) is None  # the workers failed, not the placement
    fixed = load_config(None, [], ["scaling.num_workers=3"], job="heal")
    assert refit_after_node_loss(fixed, lost, True, 0) is None
    line = failure_line(RuntimeError("the failed replica's node is gone"), fixed, lost, lost)
    assert line.startswith("training failed: 3 workers no longer fit the cluster after node(s) died: node02")
    assert "scaling.num_workers=2-3 continues on fewer" in line and "waited" not in line
