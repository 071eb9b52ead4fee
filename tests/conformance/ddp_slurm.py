"""Plain DDP as hand-written sbatch scripts do it: the rank from srun's variables (torchrun's as a fallback),
init_process_group from MASTER_ADDR/MASTER_PORT, a DistributedSampler. Rank 0 prints one CONFORMANCE line.

    srun python tests/conformance/ddp_slurm.py
    torchrun --standalone --nproc-per-node 2 tests/conformance/ddp_slurm.py
    raydist launch --workers 2 -- python tests/conformance/ddp_slurm.py
"""

import json
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

rank = int(os.environ["SLURM_PROCID"] if "SLURM_PROCID" in os.environ else os.environ["RANK"])
world = int(os.environ["SLURM_NTASKS"] if "SLURM_NTASKS" in os.environ else os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
torch.manual_seed(0)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(1)
x = torch.randn(1024, 16, generator=g)
y = (x[:, :4].sum(1) > 0).long()
data = TensorDataset(x, y)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0)
loader = DataLoader(data, batch_size=32, sampler=sampler)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
steps, loss = 0, torch.tensor(0.0)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        steps += 1
mean = loss.detach().clone()
dist.all_reduce(mean)
checksum = sum(p.detach().double().sum().item() for p in model.parameters())
launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "slurm" if "SLURM_PROCID" in os.environ else "env"
if rank == 0:
    print(
        "CONFORMANCE "
        + json.dumps(
            {
                "script": "ddp_slurm",
                "world": world,
                "steps": steps,
                "loss": f"{mean.item() / world:.6f}",
                "checksum": f"{checksum:.10e}",
                "env": {"read": "SLURM_PROCID" if "SLURM_PROCID" in os.environ else "RANK"},
            }
        ),
        flush=True,
    )
dist.barrier()
dist.destroy_process_group()
