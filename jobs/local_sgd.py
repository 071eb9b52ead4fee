"""Local SGD / periodic averaging through Ray Train: workers step alone and average parameters every H steps.

Locally (starts a Ray instance of its own; CPU workers, gloo):
    python jobs/local_sgd.py --set local_sgd.sync_every=8 --set local_sgd.averaging=ring --set local_sgd.alpha=0.5
On a Ray cluster (e.g. one booted by `sbatch cluster/ray_up.slurm`; `eval "$(raydist env)"` first):
    ray job submit --working-dir . -- python jobs/local_sgd.py --set scaling.num_workers=3
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
    exit_now(job_main("local_sgd", doc=__doc__))
