"""Measure `sbatch cluster/ray_up.slurm` on the emulated cluster: sbatch -> all nodes ready, idle memory, teardown.

    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.bringup --runs 5 --out docs/data/bringup.json
    .venv/bin/python -m benchmarks.bringup --report docs/data/bringup.json   # docs/benchmarks.md's lines

(root.) Prints one line per run and a JSON summary (medians); --out stores the runs with the machine and commit.
Builds and removes its own emulated cluster.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks import stored as stored_file
from tests.support.cluster import rayup
from tests.support.cluster.emucluster import EmulatedCluster


def measure(runs: int, nodes: int) -> dict:
    ready, clean, idle = [], [], []
    with EmulatedCluster() as cluster:
        base = rayup.memory_mib(cluster)
        cfg = rayup.write_config(cluster, "bench")
        for i in range(runs):
            cluster.wait_idle(60)
            job = rayup.submit(cluster, cfg, nodes=nodes)
            ready.append(round(job.wait_for("Ray cluster ready", timeout=180), 2))
            time.sleep(2)  # let the dashboard's start-up settle before sampling
            idle.append(round(rayup.memory_mib(cluster) - base))
            t = time.monotonic()
            cluster.run(cluster.head, ["scancel", str(job.job_id)], check=True)
            cluster.wait_job(job.job_id, timeout=60)
            left = rayup.wait_no_leftovers(cluster, job.job_id)
            clean.append(round(time.monotonic() - t, 2))
            print(
                f"run {i + 1}: sbatch->ready {ready[-1]:.1f}s, idle cluster {idle[-1]:.0f} MiB PSS, "
                f"scancel->clean {clean[-1]:.1f}s{'' if not left else f', LEFTOVERS {left}'}",
                flush=True,
            )
            if left:
                raise SystemExit(f"leftovers after scancel: {left}")
    return {
        "runs": runs,
        "nodes": nodes,
        "sbatch_to_ready_s": ready,
        "idle_memory_mib": idle,
        "scancel_to_clean_s": clean,
    }


def _spread(values: list[float], unit: str) -> str:
    return f"{statistics.median(values):.1f} {unit} (median of {len(values)}; {min(values):.1f}-{max(values):.1f})"


def report(stored: dict) -> str:
    """docs/benchmarks.md's lines for the stored runs."""
    gib = [m / 1024 for m in stored["idle_memory_mib"]]
    return (
        f"- sbatch -> all {stored['nodes']} nodes ready: {_spread(stored['sbatch_to_ready_s'], 's')};\n"
        f"- the idle cluster: {_spread(gib, 'GiB')} PSS over all its processes;\n"
        f"- scancel -> nothing left: {_spread(stored['scancel_to_clean_s'], 's')}.\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nodes", type=int, default=3)
    stored_file.add_options(p, "docs/data/bringup.json")
    a = p.parse_args()
    if stored_file.print_report(a.report, report):
        return 0
    machine_and_commit = stored_file.stamp()
    stored = measure(a.runs, a.nodes)
    print(report(stored), end="")
    stored_file.save(a.out, stored, machine_and_commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
