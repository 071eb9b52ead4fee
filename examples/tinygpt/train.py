"""TinyGPT trained by an ordinary DDP script: it reads its rank from the launcher's environment and knows nothing
of raydist. From examples/:

    raydist launch --workers 2 -- python -m tinygpt.train --steps 300
    torchrun --standalone --nproc-per-node 2 -m tinygpt.train --steps 300
    python -m tinygpt.train --steps 300                      # one process

It prints the test set's next-token accuracy at the end (chance: 1/64).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from tinygpt.data import make_datasets
from tinygpt.model import make_model


def dist_env():
    """(rank, world size) from srun's variables, else torchrun's, else a single process."""
    if "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ:
        return int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


@torch.no_grad()
def accuracy(model, test) -> float:
    model.eval()
    scores = model(test.inputs)
    model.train()
    return (scores.argmax(-1) == test.targets).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    rank, world = dist_env()
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    train, test = make_datasets()
    model = make_model()
    ddp = DDP(model) if world > 1 else model
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=0, drop_last=True)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=True)
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if rank == 0 and step % 50 == 0:
                print(f"step {step} loss {loss.item():.3f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    if rank == 0:
        print(f"done: {step} steps, test next-token accuracy {accuracy(model, test):.3f}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
        # gloo's worker threads outlive destroy_process_group under DDP (pytorch#107298) and can abort a finalizing
        # interpreter (see examples/ddp_train.py): leave without finalizing.
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
