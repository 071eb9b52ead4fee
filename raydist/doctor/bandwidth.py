"""Timed torch.distributed loops (any initialised process group: the doctor's agents, a raw benchmark) and the
arithmetic that turns their times into bandwidth figures comparable with a link's speed."""

from __future__ import annotations

import dataclasses
import time


def bus_bandwidth_gbps(nbytes: int, seconds: float, world: int) -> float:
    """All-reduce bus bandwidth in Gb/s: what each link carries in a ring all-reduce, 2(n-1)/n of the buffer per
    iteration (nccl-tests' busbw), so the figure is comparable with one link's speed whatever n is."""
    if seconds <= 0 or world < 2:
        return 0.0
    return 2 * (world - 1) / world * nbytes * 8 / seconds / 1e9


def algo_bandwidth_gbps(nbytes: int, seconds: float) -> float:
    return nbytes * 8 / seconds / 1e9 if seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Timing:
    nbytes: int
    iters: int
    seconds: float  # per iteration: the slowest rank's for all-reduce, this rank's for p2p

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _buffer(nbytes: int, device):
    import torch

    return torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)


def time_allreduce(nbytes: int, iters: int, device=None) -> Timing:
    """`iters` sum all-reduces of an `nbytes` float32 buffer after one warm-up; the slowest rank's time, since the
    collective is only as fast as it."""
    import torch
    import torch.distributed as dist

    device = device or torch.device("cpu")
    buf = _buffer(nbytes, device)
    dist.all_reduce(buf)  # warm-up: connections and algorithm set-up are not bandwidth
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(device)
    elapsed = torch.tensor(
        [time.perf_counter() - start], dtype=torch.float64 if device.type == "cpu" else torch.float32, device=device
    )
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return Timing(buf.numel() * 4, iters, float(elapsed.item()) / iters)


def time_ring_p2p(nbytes: int, iters: int, device=None) -> Timing:
    """Every rank sends `nbytes` to the next and receives from the previous, all at once: each node's link is
    exercised in both directions, and a slow one shows as the slow sender. Times are this rank's."""
    import torch
    import torch.distributed as dist

    device = device or torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError("a point-to-point test needs two ranks at least")
    send, recv = _buffer(nbytes, device), _buffer(nbytes, device)
    nxt, prev = (rank + 1) % world, (rank - 1) % world

    def exchange() -> None:
        reqs = [dist.isend(send, nxt), dist.irecv(recv, prev)]
        for r in reqs:
            r.wait()

    exchange()  # warm-up
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        exchange()
    _sync(device)
    return Timing(send.numel() * 4, iters, (time.perf_counter() - start) / iters)
