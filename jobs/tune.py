"""A sweep of one strategy's settings with Ray Tune: each trial a run of that strategy's job, ASHA stopping those
that trail, as many side by side as the cluster's CPUs hold.

Locally (one Ray instance for the sweep; every trial's job joins it):
    python jobs/tune.py --set tune.strategy=sync --set tune.num_samples=8 \
        --set tune.space.optim.lr='loguniform(1e-4, 1e-1)' --set train.epochs=5
On a Ray cluster (e.g. one booted by `sbatch cluster/ray_up.slurm`; `eval "$(raydist env)"` first):
    ray job submit --working-dir . -- python jobs/tune.py --config sweep.yaml --set run.storage_path=/shared/runs
Writes results.md (a row per trial), results.json, best.yaml (`python jobs/<strategy>.py --config best.yaml` runs
the best settings) and plot.png into <run.storage_path>/<run.name>; each trial's run is in trials/<trial id>/.
Running the same command again continues an unfinished sweep. Prints summary.json as its last line.
"""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the package travels as source, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydist.job import job_main  # noqa: E402
from raydist.process_exit import exit_now  # noqa: E402

if __name__ == "__main__":
    exit_now(job_main("tune", doc=__doc__))
