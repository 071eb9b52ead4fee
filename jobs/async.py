"""Asynchronous Downpour SGD: Ray-actor workers push gradients to parameter-server actors without waiting.

Locally (starts a Ray instance of its own):
    python jobs/async.py --set async_ps.num_servers=2 --set async_ps.n_fetch=4
On a Ray cluster (e.g. one booted by `sbatch cluster/ray_up.slurm`; `eval "$(raydist env)"` first):
    ray job submit --working-dir . -- python jobs/async.py --set scaling.num_workers=3
Re-running with the same run.name and run.storage_path resumes from the servers' latest checkpoint.
Writes <run.storage_path>/<run.name>/summary.json (fields: docs/strategies.md) and prints it as its last line.
"""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the package travels as source, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydist.job import job_main  # noqa: E402
from raydist.process_exit import exit_now  # noqa: E402

if __name__ == "__main__":
    exit_now(job_main("async", doc=__doc__))
