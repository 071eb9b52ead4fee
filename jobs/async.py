"""Asynchronous Downpour SGD: Ray-actor workers push gradients to parameter-server actors without waiting.

Locally (starts a Ray instance of its own):
    python jobs/async.py --set async_ps.num_servers=2 --set async_ps.n_fetch=4
On a Ray cluster (e.g. one booted by `sbatch cluster/ray_up.slurm`; `eval "$(raydist env)"` first):
    ray job submit --working-dir . -- python jobs/async.py --set scaling.num_workers=3
Re-running with the same run.name and run.storage_path resumes from the servers' latest checkpoint.
Ends with one JSON line: strategy, steps, wall_s, test_accuracy, checkpoint, ..., staleness_mean, staleness_max,
bytes_per_worker, wait_s_per_worker.
"""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the package travels as source, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydist.ps.driver import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(__doc__))
