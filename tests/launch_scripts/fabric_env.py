"""Lightning Fabric picks its cluster environment from the launcher's variables; writes what it chose per rank.

raydist launch --workers 2 -- python tests/launch_scripts/fabric_env.py DIR
"""

import json
import os
import sys

import torch
from lightning_fabric import Fabric
from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

fabric = Fabric(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp")
fabric.launch()
env = fabric._connector.cluster_environment
rank_sum = fabric.all_reduce(torch.tensor(float(fabric.global_rank)), reduce_op="sum").item()
views = {}
for cls in (TorchElasticEnvironment, SLURMEnvironment):
    if cls.detect():
        e = cls()
        views[cls.__name__] = [
            e.global_rank(),
            e.world_size(),
            e.local_rank(),
            e.node_rank(),
            e.main_address,
            e.main_port,
        ]
with open(os.path.join(sys.argv[1], f"rank{fabric.global_rank}.json"), "w") as f:
    json.dump(
        {
            "chosen": type(env).__name__,
            "global_rank": fabric.global_rank,
            "world_size": fabric.world_size,
            "local_rank": fabric.local_rank,
            "node_rank": fabric.node_rank,
            "rank_sum": rank_sum,
            "views": views,
        },
        f,
    )
