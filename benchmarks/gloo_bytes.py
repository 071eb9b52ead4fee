"""Bytes each gloo collective puts on the wire, counted on a private loopback: is a reduce-scatter as cheap as the
ring bound says ((n-1)/n of the tensor per rank) or does it move an all-reduce's bytes?

    sudo unshare -n sh -c 'ip link set lo up && .venv/bin/python -m benchmarks.gloo_bytes --ranks 4'
    sudo unshare -n sh -c 'ip link set lo up && .venv/bin/python -m benchmarks.gloo_bytes --out docs/data/gloo_bytes.json'
    .venv/bin/python -m benchmarks.gloo_bytes --report docs/data/gloo_bytes.json       # the line docs/ quote

(root: `unshare -n` gives the run a network namespace of its own, so its loopback counter holds only these ranks'
traffic.) The stored count is docs/data/gloo_bytes.json (quoted in docs/strategies.md and docs/costmodel.md). The
cost model (raydist/planning/costmodel.py, `Setting.backend`) counts FSDP's reduce-scatter on gloo as an all-reduce.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks import stored as stored_file

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
    run = {
        "all_reduce": lambda: dist.all_reduce(full),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(part, full),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(full, part),
    }
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


def ring_bound(op: str, n: int) -> int:
    """Bytes per rank a ring moves, in tensors, summed over the ranks' sends: 2(n-1) for an all-reduce, else n-1."""
    return 2 * (n - 1) if op == "all_reduce" else n - 1


def report(stored: dict) -> str:
    """The line docs/ quote."""
    n = stored["ranks"]
    return (
        ", ".join(f"{op} {stored['moved'][op]:.1f}x" for op in OPS) + f" the tensor on the wire in all over {n} "
        f"gloo ranks (ring bounds {', '.join(f'{ring_bound(op, n):.1f}x' for op in OPS)})\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mib", type=int, default=4, help="tensor size")
    p.add_argument("--port", type=int, default=29533)
    stored_file.add_options(p, "docs/data/gloo_bytes.json")
    a = p.parse_args()
    if stored_file.print_report(a.report, report):
        return 0
    machine_and_commit = stored_file.stamp()
    numel = a.mib * (1 << 20) // 4 // a.ranks * a.ranks
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(a.ranks, numel, a.port, out), nprocs=a.ranks)
    moved = dict(out.get() for _ in OPS)
    result = {"ranks": a.ranks, "mib": a.mib, "moved": {op: round(moved[op], 3) for op in OPS}}
    print(report(result), end="")
    stored_file.save(a.out, result, machine_and_commit)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
