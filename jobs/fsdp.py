"""Fully sharded data parallel (FSDP2, torch.distributed.fsdp.fully_shard) through Ray Train's TorchTrainer.

Locally (starts a Ray instance of its own; CPU workers, gloo):
    python jobs/fsdp.py --set train.epochs=5
On a Ray cluster (e.g. one booted by `sbatch cluster/ray_up.slurm`; `eval "$(raydist env)"` first):
    ray job submit --working-dir . -- python jobs/fsdp.py --set scaling.num_workers=3 --set run.storage_path=/shared/runs
Each worker holds 1/W of the parameters, gradients and optimizer state. Every worker writes its shards of each
checkpoint (torch.distributed.checkpoint) into the run directory, so run.storage_path must be shared by all nodes.
Re-running with the same run.name and run.storage_path resumes from the latest checkpoint, with any worker count.
Writes <run.storage_path>/<run.name>/summary.json (fields: docs/strategies.md) and prints it as its last line.
"""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the package travels as source, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydist.job import job_main  # noqa: E402
from raydist.process_exit import exit_now  # noqa: E402

if __name__ == "__main__":
    exit_now(job_main("fsdp", doc=__doc__))
