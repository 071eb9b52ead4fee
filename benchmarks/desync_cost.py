"""What the desync check costs per training step: two gloo ranks train the same DDP model under each setting in
turn, block by block, so machine load hits every setting alike.

    .venv/bin/python -m benchmarks.desync_cost [--rounds 30] [--block 100] [--set model.hidden=1024 ...]
    .venv/bin/python -m benchmarks.desync_cost --rounds 30 --out docs/data/desync_cost.json      # stored, as quoted
    .venv/bin/python -m benchmarks.desync_cost --rounds 10 --set model.hidden=1024 --set model.depth=4 \
        --out docs/data/desync_cost_large.json
    .venv/bin/python -m benchmarks.desync_cost --report docs/data/desync_cost.json  # docs/faults.md's lines

Each rank runs what the loop runs for sync DDP (`SyncDDP`'s micro_step / after_backward, the fingerprint of
raydist.train.desync) on digits batches:
  off        faults.desync_every_steps=0: DDP's own bucketed all-reduce every step
  every 100  the default: on one step in 100 DDP skips its all-reduce (no_sync), the rank reads its gradient norm,
             averages the gradients itself, and computes its parameter checksum
  every 1    all of that on every step: an upper bound
Reported: rank 0's median time per step over the blocks, and the median of per-round ratios to "off".
(The two extra floats per rank in the sync point's all-reduce are not included: that all-reduce runs anyway.)
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from types import SimpleNamespace

from benchmarks import stored as stored_file

SETTINGS = {"off": 0, "every 100": 100, "every 1": 1}


def _rank(rank: int, port: int, args: argparse.Namespace, out) -> None:
    import torch
    import torch.distributed as dist

    from raydist.config import load_config
    from raydist.strategies.sync.worker import SyncDDP
    from raydist.torchkit.commstats import CommStats
    from raydist.torchkit.data import load_splits
    from raydist.torchkit.models import build_model
    from raydist.train.desync import param_checksum

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cfg = load_config(None, [], args.overrides, job="sync")
    data = load_splits(cfg.data)
    b = cfg.train.batch_size
    x, y = data.train.tensors[0][rank * b : (rank + 1) * b].float(), data.train.tensors[1][rank * b : (rank + 1) * b]
    ctx = SimpleNamespace(rank=rank, world_size=2, device=torch.device("cpu"))
    runs = {}
    for name in SETTINGS:
        torch.manual_seed(0)
        model = build_model(cfg.model, data)
        strategy = SyncDDP(cfg, ctx, CommStats())
        ddp = strategy.wrap(model)
        runs[name] = (model, ddp, strategy, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def block(name: str) -> float:
        model, ddp, strategy, opt = runs[name]
        every = SETTINGS[name]
        dist.barrier()
        t0 = time.perf_counter()
        for step in range(1, args.block + 1):
            due = bool(every) and step % every == 0
            strategy.measure_local_grad_norm(due)
            with strategy.micro_step(True):
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            strategy.after_backward(step)
            torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            opt.step()
            opt.zero_grad(set_to_none=True)
            if due:
                torch.stack([strategy.local_grad_norm(), param_checksum(model)]).tolist()
        return (time.perf_counter() - t0) / args.block

    for name in SETTINGS:  # warm-up
        block(name)
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name in SETTINGS:
            times[name].append(block(name))
    if rank == 0:
        out.put(
            {
                "model": cfg.model.name,
                "params": sum(p.numel() for p in runs["off"][0].parameters()),
                "batch": b,
                "rounds": args.rounds,
                "block": args.block,
                "overrides": args.overrides,
                "s_per_step": {name: [round(t, 7) for t in times[name]] for name in SETTINGS},
            }
        )
    dist.destroy_process_group()


def report(stored: dict) -> str:
    """The command and the lines docs/faults.md quotes: rank 0's median step per setting and the median of the
    per-round ratios to "off"."""
    times = stored["s_per_step"]
    sets = "".join(f" --set {o}" for o in stored["overrides"])
    lines = [
        f"$ .venv/bin/python -m benchmarks.desync_cost --rounds {stored['rounds']} --block {stored['block']}{sets}",
        f"sync DDP, 2 gloo ranks, model {stored['model']} ({stored['params']} parameters), "
        f"batch {stored['batch']}: off {statistics.median(times['off']) * 1e3:.3f} ms/step "
        f"(median of {stored['rounds']} blocks of {stored['block']} steps)",
    ]
    ratio = {}
    for name in list(SETTINGS)[1:]:
        ratio[name] = statistics.median(t / o for t, o in zip(times[name], times["off"]))
        lines.append(
            f"  {name}: {statistics.median(times[name]) * 1e3:.3f} ms/step, "
            f"{ratio[name]:.4f}x of off (median of per-round ratios)"
        )
    check = ratio["every 1"] - 1  # a check on every step: what one check adds to a step
    lines.append(
        f"  one check adds {check:.0%} to its step; checking every 100 steps (the default) adds "
        f"{check / 100:.2%} of the step time"
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    import torch.multiprocessing as mp

    ap = stored_file.parser(__doc__, rounds=30)
    ap.add_argument("--block", type=int, default=100)
    ap.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    stored_file.add_options(ap, "docs/data/desync_cost.json")
    args = ap.parse_args()
    if stored_file.print_report(args.report, report):
        return
    machine_and_commit = stored_file.stamp()
    with socket.socket() as s:  # a free loopback port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_rank, args=(port, args, out), nprocs=2)
    result = out.get()
    print(report(result), end="")
    stored_file.save(args.out, result, machine_and_commit)


if __name__ == "__main__":
    main()
