"""Ray's daemons on a SLURM cluster's nodes at idle priority or as Ray starts them: jobs/sync.py's loop on the
emulated cluster with cluster.yaml's `yield_daemons: true` (opt-in) against `false` (the default).

    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.footprint_cluster --rounds 3 --out docs/data/footprint_cluster.json
    .venv/bin/python -m benchmarks.footprint_cluster --report docs/data/footprint_cluster.json

(root.) Builds its own emulated cluster (3 hosts on this machine's cores). Each round brings Ray up twice with
`sbatch cluster/ray_up.slurm`, once each way in alternating order, and submits the same job from the head node with
`ray job submit`: `jobs/sync.py` on 3 workers, one per host, at benchmarks/footprint_sync.py's >= 50 ms step. The
loop and the CPU beside the ranks are read as footprint_sync reads them (metrics.jsonl; every process's CPU time from
/proc, the machine's busy time). Reported: the loop's steps/s with the daemons yielding over without, its second half,
the median step, and the CPU seconds beside the ranks each way. Run nothing else meanwhile.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.footprint_sync import STEP_50MS, one, ratios
from benchmarks.stored import add_options, parser, print_report, save, spread, stamp
from tests.support.cluster import rayup
from tests.support.cluster.emucluster import EmulatedCluster

REPO = Path(__file__).resolve().parents[1]
SIDES = ("yielding", "as_started")
RANKS = ("ray::RayTrainWorker",)


def measure_one(cluster: EmulatedCluster, side: str, i: int, overrides: list[str]) -> dict:
    """Ray brought up with yield_daemons as `side` says, the job run on it, the cluster scancelled."""
    cluster.wait_idle(60)
    job = rayup.submit(cluster, rayup.write_config(cluster, f"fp-{side}{i}", yield_daemons=side == "yielding"))
    try:
        job.wait_for("Ray cluster ready", timeout=180)
        storage, name = cluster.shared / "runs", f"{side}{i}"
        sets = ["scaling.num_workers=3", f"run.storage_path={storage}", f"run.name={name}", *overrides]
        submit = ["ray", "job", "submit", "--working-dir", ".", "--", "python", "jobs/sync.py"]
        argv = cluster.nsenter(cluster.head) + [
            "env",
            "-C",
            str(REPO),
            *submit,
            *[w for s in sets for w in ("--set", s)],
        ]
        return one(argv, storage / name, RANKS, env=job.env())
    finally:
        cluster.run(cluster.head, ["scancel", str(job.job_id)])
        cluster.wait_job(job.job_id, timeout=120)
        rayup.wait_no_leftovers(cluster, job.job_id)


def report(data: dict) -> str:
    rounds = data["rounds"]
    # ratios() divides by its baseline side, named "torchrun" there: here the daemons as Ray starts them.
    got = ratios([{"torchrun": r["as_started"], "yielding": r["yielding"]} for r in rounds], "yielding")
    beside = {side: [r[side]["beside_ranks_cpu_s"] for r in rounds] for side in SIDES}
    step = spread([r["as_started"]["median_step_s"] * 1000 for r in rounds], 0)
    return (
        "\n".join(
            [
                f"`jobs/sync.py` by `ray job submit` on the emulated 3-host cluster, 3 workers, with `yield_daemons: true` "
                f"against `false`, {len(rounds)} rounds alternating the order on {data['machine']['cpus']} CPUs shared by "
                f"the 3 hosts (median (min-max); {data['commit'][:7]}, {data['date']}; {rounds[0]['as_started']['steps']} "
                f"steps of {step} ms with the daemons as Ray starts them):",
                "",
                "| | yielding / as started |",
                "|---|---|",
                f"| the loop's steps/s | {spread(got['loop'], 2)}x |",
                f"| the loop's second half, steps/s | {spread(got['late_loop'], 2)}x |",
                f"| the median step's speed | {spread(got['median_step'], 2)}x |",
                f"| CPU seconds beside the ranks over the loop | {spread(beside['yielding'])} s against "
                f"{spread(beside['as_started'])} s |",
            ]
        )
        + "\n"
    )


def main() -> int:
    ap = parser(__doc__, rounds=3)
    add_options(ap, "docs/data/footprint_cluster.json")
    args = ap.parse_args()
    if print_report(args.report, report):
        return 0
    overrides = [*STEP_50MS, "train.epochs=2"]
    stamped, data = stamp(), {"overrides": overrides, "rounds": []}
    with EmulatedCluster() as cluster:
        for i in range(args.rounds):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            data["rounds"].append({side: measure_one(cluster, side, i, overrides) for side in order})
            print(json.dumps(data["rounds"][-1]), flush=True)
    save(args.out, data, stamped)
    print(report({**data, **stamped}), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
