"""Bytes each gloo collective puts on the wire, counted on a private loopback: is a reduce-scatter as cheap as the
ring bound says ((n-1)/n of the tensor per rank) or does it move an all-reduce's bytes?

    sudo unshare -n sh -c 'ip link set lo up && .venv/bin/python benchmarks/gloo_bytes.py --ranks 4'

(root: `unshare -n` gives the run a network namespace of its own, so its loopback counter holds only these ranks'
traffic.) Measured with torch 2.13 (docs/strategies.md, FSDP): all_reduce 6.0x, reduce_scatter_tensor 6.0x,
all_gather_into_tensor 3.0x the tensor in all over 4 ranks; the ring bounds are 6.0x, 3.0x and 3.0x. The cost
model (raydist/costmodel.py, `Setting.backend`) counts FSDP's reduce-scatter on gloo as an all-reduce.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = ("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor")


def loopback_tx_bytes() -> int:
    with open("/proc/net/dev") as f:
        for line in f:
            if line.strip().startswith("lo:"):
                return int(line.split(":")[1].split()[8])
    raise RuntimeError("no loopback in /proc/net/dev")


def rank_main(rank: int, world: int, numel: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    full, part = torch.ones(numel), torch.ones(numel // world)
    run = {"all_reduce": lambda: dist.all_reduce(full),
           "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(part, full),
           "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(full, part)}
    for op in OPS:
        run[op]()  # the first call sets up connections
        dist.barrier()
        before = loopback_tx_bytes()
        for _ in range(5):
            run[op]()
        dist.barrier()
        if rank == 0:
            out.put((op, (loopback_tx_bytes() - before) / 5 / (numel * 4)))
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mib", type=int, default=4, help="tensor size")
    p.add_argument("--port", type=int, default=29533)
    a = p.parse_args()
    numel = a.mib * (1 << 20) // 4 // a.ranks * a.ranks
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(a.ranks, numel, a.port, out), nprocs=a.ranks)
    n = a.ranks
    bound = {"all_reduce": 2 * (n - 1), "reduce_scatter_tensor": n - 1, "all_gather_into_tensor": n - 1}
    for _ in OPS:
        op, moved = out.get()
        print(f"{op}: {moved:.2f}x the tensor on the wire over {n} ranks (ring bound {bound[op]:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
