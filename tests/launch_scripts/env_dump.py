"""Writes the launcher variables this rank sees to <dir>/rank<RANK>.json, after an all-reduce over them.

raydist launch --workers 3 -- python tests/launch_scripts/env_dump.py DIR
"""

import json
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// from MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
seen = {
    k: v
    for k, v in os.environ.items()
    if k.startswith(("SLURM", "TORCHELASTIC", "CUDA_", "RAY_JOB"))
    or k
    in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
        "PYTHONFAULTHANDLER",
    )
}
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"env": seen, "rank_sum": total.item(), "hostname": os.uname().nodename}, f)
dist.destroy_process_group()
