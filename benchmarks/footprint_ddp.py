"""A torchrun-style DDP script with a realistic CPU step, for benchmarks/footprint.py: what a user runs for hours.

    torchrun --standalone --nproc-per-node 2 benchmarks/footprint_ddp.py --steps 300 --out /tmp/fp.json
    raydist launch --workers 2 -- python benchmarks/footprint_ddp.py --steps 300 --out /tmp/fp.json

An MLP of about 4M parameters on synthetic data, batch 256, gloo: a step of about 0.1 s with two ranks on two cores. It reads
only the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Rank 0 writes, to --out, each step's
seconds, the loop's seconds (after a few warm-up steps), and the CPU seconds of both ranks over the loop; it touches
`<out>.start` and `<out>.end` around the timed loop, so that the benchmark can sample the machine over it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist

WARMUP = 5


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hidden", type=int, default=1280)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    h = args.hidden
    model = torch.nn.Sequential(
        torch.nn.Linear(512, h), torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h),
        torch.nn.ReLU(), torch.nn.Linear(h, 10),
    )  # fmt: skip
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(args.batch, 512, generator=gen), torch.randint(0, 10, (args.batch,), generator=gen)

    steps, began, cpu0 = [], 0.0, 0.0
    for step in range(WARMUP + args.steps):
        if step == WARMUP:
            dist.barrier()
            if rank == 0:
                Path(f"{args.out}.start").touch()
            began, cpu0 = time.perf_counter(), cpu_s()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        steps.append(time.perf_counter() - t)
    dist.barrier()
    loop_s, cpu = time.perf_counter() - began, cpu_s() - cpu0
    if rank == 0:
        Path(f"{args.out}.end").touch()
    cpus = [None] * dist.get_world_size()
    dist.all_gather_object(cpus, cpu)
    if rank == 0:
        timed = steps[WARMUP:]
        args.out.write_text(json.dumps({"loop_s": loop_s, "step_s": timed, "ranks_cpu_s": cpus, "pid": os.getpid()}))
        print(f"step {len(timed)} loop {loop_s:.2f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
