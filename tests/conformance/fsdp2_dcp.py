"""FSDP2 (`fully_shard`) with torch.distributed.checkpoint, as a script that survives a time limit: on SIGTERM every
rank saves the sharded snapshot to SNAPSHOT_DIR and exits 0; started again, it resumes there and ends at the same
step with the same parameters as a run never interrupted. Rank 0 prints one CONFORMANCE line.

    torchrun --standalone --nproc-per-node 2 tests/conformance/fsdp2_dcp.py SNAPSHOT_DIR [STEP_SLEEP_S]
    raydist launch --workers 2 -- python tests/conformance/fsdp2_dcp.py SNAPSHOT_DIR
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

STEPS = 40
snapshot, step_sleep = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
start = 0
if os.path.exists(os.path.join(snapshot, ".metadata")):
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=snapshot)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    start = int(state["step"])
    if rank == 0:
        print(f"resumed from {snapshot} at step {start}", flush=True)
stop = torch.zeros(1)
signal.signal(signal.SIGTERM, lambda *_: stop.fill_(1))
loss = torch.zeros(())
for step in range(start, STEPS):
    flag = stop.clone()
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank stops at the same step
    if flag.item():
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd, "step": torch.tensor(step)}, checkpoint_id=snapshot)
        if rank == 0:
            print(f"SIGTERM: snapshot at step {step}, exiting", flush=True)
        dist.destroy_process_group()
        sys.exit(0)
    g = torch.Generator().manual_seed(1000 * step + rank)  # each step's batch, whatever start it runs in
    x = torch.randn(32, 16, generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), (x[:, :4].sum(1) > 0).long())
    loss.backward()
    opt.step()
    if rank == 0 and (step + 1) % 10 == 0:
        print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
    time.sleep(step_sleep)
mean = loss.detach().clone()
dist.all_reduce(mean)
checksum = sum(p.full_tensor().double().sum().item() for p in model.parameters())
if rank == 0:
    print(
        "CONFORMANCE "
        + json.dumps(
            {
                "script": "fsdp2_dcp",
                "world": world,
                "steps": STEPS,
                "resumed_from": start,
                "loss": f"{mean.item() / world:.6f}",
                "checksum": f"{checksum:.10e}",
                "env": {"sharded": type(next(model.parameters())).__name__},
            }
        ),
        flush=True,
    )
dist.destroy_process_group()
