"""Local SGD's averaging: the ring exchange completes and mixes correctly for any world size (real gloo, real processes)."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

from tests.support.jobutil import refusal


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _averaging_worker(rank: int, world_size: int, port: int, alpha: float, results) -> None:
    import torch
    import torch.distributed as dist

    from raydist.strategies.local_sgd.worker import average_allreduce, ring_polyak

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        flat = torch.full((1000,), float(rank))
        rings = []
        for _ in range(3):  # repeated rounds: a leftover message would shift the next round
            ring_polyak(flat, alpha, rank, world_size)
            rings.append(flat[0].item())
        mean = torch.arange(world_size, dtype=torch.float32)[rank].repeat(7)
        average_allreduce(mean, world_size)
        results.put((rank, rings, mean.tolist()))
    finally:
        dist.destroy_process_group()


def _expected_rings(world_size: int, alpha: float, rounds: int = 3) -> list[list[float]]:
    values = [float(r) for r in range(world_size)]
    history = [[] for _ in range(world_size)]
    for _ in range(rounds):
        values = [(1 - alpha) * values[r] + alpha * values[(r - 1) % world_size] for r in range(world_size)]
        for r in range(world_size):
            history[r].append(values[r])
    return history


def _context():
    """Processes forked from one server that imported torch once (a fresh process each, as spawn gives, without
    ten imports of torch for the four world sizes)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "raydist.strategies.local_sgd.worker"])
    return ctx


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_ring_exchange_completes_and_mixes_with_the_left_neighbour(world_size):
    ctx = _context()
    results = ctx.Queue()
    alpha, port = 0.3, _free_port()
    procs = [
        ctx.Process(target=_averaging_worker, args=(r, world_size, port, alpha, results)) for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in range(world_size):
            rank, rings, mean = results.get(timeout=90)  # a deadlock shows up here, not as a hung test run
            got[rank] = (rings, mean)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    expected = _expected_rings(world_size, alpha)
    for rank in range(world_size):
        rings, mean = got[rank]
        assert rings == pytest.approx(expected[rank], abs=1e-6), rank
        assert mean == pytest.approx([sum(range(world_size)) / world_size] * 7)
    assert all(p.exitcode == 0 for p in procs)


@pytest.mark.parametrize(
    "override, names",
    [
        ("local_sgd.averaging=star", "local_sgd.averaging"),
        ("local_sgd.alpha=0", "local_sgd.alpha"),
        ("local_sgd.sync_every=0", "local_sgd.sync_every"),
    ],
)
def test_bad_local_sgd_config_is_one_line_and_exit_2(override, names):
    assert names in refusal("local_sgd", "--set", override)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.shared_ray
def test_stopped_local_sgd_run_resumes_with_identical_losses(tmp_path):
    """Stopped between two averagings (each rank's own model and optimizer in the checkpoint), resumed, it matches
    an uninterrupted run loss for loss; ring averaging makes every sync point exchange, dropout draws randoms.
    Resumed again with fewer workers, it goes on from rank 0's replica."""
    from raydist.observability.metrics import read_steps
    from tests.support.jobutil import run_job, summary

    common = [
        f"run.storage_path={tmp_path}",
        "train.epochs=2",
        "checkpoint.every_steps=10",
        "model.dropout=0.2",
        "local_sgd.sync_every=4",
        "local_sgd.averaging=ring",
    ]
    straight = summary(run_job("local_sgd", *common, "run.name=straight"))
    stopped = summary(run_job("local_sgd", *common, "run.name=resumed", "train.stop_at_step=13"))
    assert stopped["steps"] == 13 and stopped["status"] == "stopped"  # one step past the sync point at 12
    resumed = summary(run_job("local_sgd", *common, "run.name=resumed"))
    assert resumed["resumed_from_step"] == 13 and resumed["status"] == "completed"
    assert resumed["steps"] == straight["steps"] == 44

    a, b = read_steps(straight["metrics_file"]), read_steps(resumed["metrics_file"])
    assert sorted(b) == sorted(a) == list(range(1, 45))
    for step in range(14, 45):
        assert b[step]["loss"] == a[step]["loss"], (step, a[step], b[step])
        assert b[step]["lr"] == a[step]["lr"]
    assert resumed["test_accuracy"] == straight["test_accuracy"]

    # With one worker (an elastic run that lost a node), the run goes on from rank 0's replica file.
    shrunk = summary(
        run_job("local_sgd", *common[:1], "train.epochs=3", *common[2:], "run.name=resumed", "scaling.num_workers=1")
    )
    assert shrunk["resumed_from_step"] == 44 and shrunk["status"] == "completed" and shrunk["workers"] == 1
    # An epoch is 44 steps on one worker (the per-worker batch is kept): epoch 3 runs steps 89-132.
    assert shrunk["steps"] == shrunk["total_steps"] == 132 and shrunk["test_accuracy"] >= 0.8
