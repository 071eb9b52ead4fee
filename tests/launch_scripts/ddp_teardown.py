"""A DDP script as users write it, ending the way that can hang or abort in interpreter teardown: gloo,
DistributedSampler, destroy_process_group() at the end while the DDP model is still alive, then a plain return.
Every rank prints one last line; whatever comes after it is the interpreter's way out.

    srun python tests/launch_scripts/ddp_teardown.py          (reads SLURM_PROCID/SLURM_NTASKS, or RANK/WORLD_SIZE)
    raydist launch --workers 3 --output all -- python tests/launch_scripts/ddp_teardown.py
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
world = int(os.environ.get("SLURM_NTASKS", os.environ.get("WORLD_SIZE", "1")))
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
x = torch.randn(512, 32)
data = TensorDataset(x, (x.sum(1) > 0).long())
loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, num_replicas=world, rank=rank))
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    loader.sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
checksum = sum(p.detach().double().sum().item() for p in model.parameters())
dist.destroy_process_group()
print(f"LAST LINE rank {rank} checksum {checksum:.10e}", flush=True)
