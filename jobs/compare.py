"""Sync DDP, local SGD and the async PS on the same model, data, workers, sample budget and straggler setting.

Locally (each strategy's job starts a Ray instance of its own):
    python jobs/compare.py --set scaling.num_workers=3 --set straggler.worker=2 --set straggler.slowdown=3
On a Ray cluster (e.g. one booted by `sbatch cluster/ray_up.slurm`; `eval "$(raydist env)"` first):
    ray job submit --working-dir . -- python jobs/compare.py --set scaling.num_workers=3 --set run.storage_path=/shared/runs
Writes results.json, results.md (the table) and plot.png (test accuracy and loss against wall-clock time) into
compare.output_dir (default <run.storage_path>/<run.name>), prints the table, writes summary.json there and prints it as its last line.
"""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the package travels as source, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydist.job import job_main  # noqa: E402
from raydist.process_exit import exit_now  # noqa: E402

if __name__ == "__main__":
    exit_now(job_main("compare", doc=__doc__))
