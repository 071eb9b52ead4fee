"""A DDP training script written the way hand-written cluster scripts are: nothing in it knows about raydist.

    srun --ntasks-per-node=1 python examples/ddp_train.py --epochs 4     # from examples/srun_before.sbatch
    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py --epochs 4
    raydist launch --workers 2 -- python examples/ddp_train.py --epochs 4

It reads its rank from SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (srun) or RANK/WORLD_SIZE/LOCAL_RANK (torchrun),
expects MASTER_ADDR/MASTER_PORT in its environment, calls init_process_group itself, wraps a small CNN in DDP,
shards synthetic images with DistributedSampler, and keeps its own snapshot: loaded at start, written every
--snapshot-every steps and when SIGTERM arrives (all ranks agree on the step to stop at, then exit 0). It ends by
printing the checksum of its parameters, which is the same however it was launched.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:  # optional: step and loss for `raydist top`; does nothing under srun or torchrun
    from raydist.hook import report
except ImportError:

    def report(**_):
        pass


def dist_env():
    """(rank, world size, local rank) from srun's variables, else torchrun's, else a single process."""
    if "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ:
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]), int(os.environ.get("SLURM_LOCALID", 0))
    if "RANK" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", 0))
    return 0, 1, 0


def synthetic_images(n, seed=0):
    """Noisy copies of ten random 1x16x16 class templates: learnable, and identical on every rank."""
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 1, 16, 16, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    x = templates[y] + 2.0 * torch.randn(n, 1, 16, 16, generator=g)
    return TensorDataset(x, y)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def save_snapshot(path, model, opt, epoch, done, step):
    tmp = f"{path}.tmp"
    torch.save(
        {"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch, "done": done, "step": step}, tmp
    )
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--snapshot", default="snapshot.pt", help="the run's snapshot file (on storage every rank sees)")
    p.add_argument("--snapshot-every", type=int, default=20, help="steps between snapshots")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step (slow it down)")
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader worker processes")
    p.add_argument("--out", default="", help="rank 0 writes the final checksum here (JSON)")
    args = p.parse_args()

    rank, world, local_rank = dist_env()
    use_cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo", rank=rank, world_size=world)

    stop = {"asked": False}

    def on_sigterm(*_):
        print(f"rank {rank}: SIGTERM received", flush=True)
        stop["asked"] = True

    signal.signal(signal.SIGTERM, on_sigterm)

    torch.manual_seed(0)
    # find_unused_parameters: DDP then keeps its first gradient-bucket layout instead of rebuilding it after the
    # first step; with 3+ ranks the layout decides the order gloo/NCCL add the ranks' gradients in, so a resumed
    # run would differ from an uninterrupted one in the last bits.
    model = DDP(SmallCNN().to(device), device_ids=[local_rank] if use_cuda else None, find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    data = synthetic_images(args.samples)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, num_workers=args.loader_workers)

    epoch, done, step, resumed = 0, 0, 0, None
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, map_location=device)
        model.module.load_state_dict(snap["model"])
        opt.load_state_dict(snap["opt"])
        epoch, done, step, resumed = snap["epoch"], snap["done"], snap["step"], snap["step"]
        if rank == 0:
            print(f"resumed from {args.snapshot} at step {step} (epoch {epoch}, batch {done})", flush=True)

    stopped = False
    while epoch < args.epochs and not stopped:
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < done:
                continue  # this epoch's batches the snapshot already trained on
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step, done = step + 1, i + 1
            report(step=step, loss=loss.item())
            if rank == 0 and (step == 1 or step % args.log_every == 0):
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
            if args.step_sleep:
                time.sleep(args.step_sleep)
            flag = torch.tensor([1.0 if stop["asked"] else 0.0], device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
            if flag.item() or step % args.snapshot_every == 0:
                if rank == 0:
                    save_snapshot(args.snapshot, model, opt, epoch, done, step)
                dist.barrier()
            if flag.item():
                stopped = True
                if rank == 0:
                    print(f"SIGTERM: snapshot at step {step}, exiting", flush=True)
                break
        else:
            epoch, done = epoch + 1, 0

    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    if rank == 0 and not stopped:
        print(f"done: {step} steps, checksum {checksum:.12e}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"checksum": checksum, "steps": step, "resumed_from": resumed, "world_size": world}, f)
    dist.barrier()  # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()
    # torch 2.13: DDP keeps the process group, and gloo's worker threads with it, alive past destroy_process_group
    # (pytorch#107298). A worker that frees its last work while Python finalizes aborts the process ("terminate
    # called without an active exception"; a few runs in a hundred on a loaded machine), so leave without
    # finalizing: every file this script wrote is closed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
