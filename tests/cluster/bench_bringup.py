"""Measure `sbatch cluster/ray_up.slurm` on the emulated cluster: sbatch -> all nodes ready, idle memory, teardown.

    sudo .venv/bin/python tests/cluster/bench_bringup.py [--runs 5] [--nodes 3]

Prints one line per run and a JSON summary (medians). Builds and removes its own emulated cluster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import rayup  # noqa: E402
from emucluster import EmulatedCluster  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nodes", type=int, default=3)
    a = p.parse_args()
    ready, clean, idle = [], [], []
    with EmulatedCluster() as cluster:
        base = rayup.memory_mib(cluster)
        cfg = rayup.write_config(cluster, "bench")
        for i in range(a.runs):
            cluster.wait_idle(60)
            job = rayup.submit(cluster, cfg, nodes=a.nodes)
            ready.append(job.wait_for("Ray cluster ready", timeout=180))
            time.sleep(2)  # let the dashboard's start-up settle before sampling
            idle.append(rayup.memory_mib(cluster) - base)
            t = time.monotonic()
            cluster.run(cluster.head, ["scancel", str(job.job_id)], check=True)
            cluster.wait_job(job.job_id, timeout=60)
            left = rayup.wait_no_leftovers(cluster, job.job_id)
            clean.append(time.monotonic() - t)
            print(f"run {i + 1}: sbatch->ready {ready[-1]:.1f}s, idle cluster {idle[-1]:.0f} MiB PSS, "
                  f"scancel->clean {clean[-1]:.1f}s{'' if not left else f', LEFTOVERS {left}'}", flush=True)
    print(json.dumps({"runs": a.runs, "nodes": a.nodes, "sbatch_to_ready_median_s": round(statistics.median(ready), 1),
                      "sbatch_to_ready_s": [round(x, 1) for x in ready],
                      "idle_memory_median_mib": round(statistics.median(idle)),
                      "scancel_to_clean_median_s": round(statistics.median(clean), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
