"""Writes the launcher variables this rank sees to <dir>/rank<RANK>.json, after an all-reduce over them; with
--beside, once the embedded Ray instance beside it is up, the niceness of its daemons too.

raydist launch --workers 3 -- python tests/launch_scripts/env_dump.py DIR [--beside]
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
        "RAY_prestart_worker_first_driver",
    )
}


def _daemons_niceness() -> dict[str, int]:
    """The niceness of the Ray daemons beside this rank, under its launcher (the embedded instance's driver)."""
    import psutil

    found = {}
    for p in psutil.Process(os.getppid()).children(recursive=True):
        try:
            argv = p.cmdline()
        except psutil.Error:
            continue
        if argv and os.path.basename(argv[0]) in ("gcs_server", "raylet"):
            found[os.path.basename(argv[0])] = os.getpriority(os.PRIO_PROCESS, p.pid)
    return found


def _beside(timeout_s: float = 60.0) -> dict[str, int]:
    """The daemons' niceness once the raylet is up and the gcs_server has been lowered, or as it is at the timeout:
    the first start's ranks run before the embedded instance is up."""
    import time

    deadline = time.monotonic() + timeout_s
    found = _daemons_niceness()
    while not ("raylet" in found and found.get("gcs_server", 0) > 0) and time.monotonic() < deadline:
        time.sleep(0.2)
        found = _daemons_niceness()
    return found


with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(
        {
            "env": seen,
            "rank_sum": total.item(),
            "hostname": os.uname().nodename,
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
            "beside": _beside() if "--beside" in sys.argv[2:] else {},
        },
        f,
    )
dist.destroy_process_group()
