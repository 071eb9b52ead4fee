"""Synchronous data-parallel training (PyTorch DDP) through Ray Train's TorchTrainer.

Locally (starts a Ray instance of its own; CPU workers, gloo):
    python jobs/sync.py --set train.epochs=5
On a Ray cluster (e.g. one booted by `sbatch cluster/ray_up.slurm`; `eval "$(raydist env)"` first):
    ray job submit --working-dir . -- python jobs/sync.py --set scaling.num_workers=3
Re-running with the same run.name and run.storage_path resumes from the latest checkpoint.
Writes <run.storage_path>/<run.name>/summary.json (fields: docs/strategies.md) and prints it as its last line.
"""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the package travels as source, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydist.job import job_main  # noqa: E402
from raydist.process_exit import exit_now  # noqa: E402

if __name__ == "__main__":
    exit_now(job_main("sync", doc=__doc__))
