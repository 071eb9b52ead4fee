"""Time to the first step on a warm Ray cluster against `srun` + `torchrun` started cold on the same hosts.

    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.first_step --rounds 3 --out docs/data/first_step.json
    .venv/bin/python -m benchmarks.first_step --report docs/data/first_step.json   # docs/benchmarks.md's table

(root: it builds the emulated 3-host SLURM cluster of tests/support/cluster/emucluster.py and brings Ray up on it with
cluster/ray_up.slurm, which then stays up: the warm cluster.) Each round, in alternating order:

- Ray: `ray job submit --working-dir . -- python jobs/sync.py` from master-node, 2 workers;
- launch: the same with `--set scaling.engine=launch` (the workers as plain processes of raydist launch);
- shared: `ray job submit -- python jobs/sync.py --set scaling.engine=launch`, no `--working-dir`: the repo is on
  the cluster's shared file system, as on a SLURM cluster, where the job's driver starts in it (the directory
  `sbatch cluster/ray_up.slurm` was submitted from) and nothing is packed, uploaded or unpacked;
- direct: `python jobs/sync.py --set scaling.engine=launch` on master-node after `eval "$(raydist env)"`, the
  driver started by hand on the login node as `raydist launch` is (no `ray job submit`);
- srun + torchrun: the hand-written way, a job step inside the same allocation (`srun --overlap`) on 2 hosts, each
  picking its interface in a `case` on its host name, `torchrun` with a static master address running the same
  loop (benchmarks/torchrun_sync.py).

Both run 1 epoch of digits and write the loop's `startup` record (raydist.train.loop) to metrics.jsonl on the
shared storage; the time to the first step is that record's `first_step` minus the moment this script launched the
command (one clock: the emulated hosts share the machine's). Prints each round, the medians and their ratio;
--out stores the rounds with the machine and commit.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks import stored as stored_file
from raydist.observability.metrics import startup_records

REPO = Path(__file__).resolve().parents[1]

PORT = 19556  # below the cluster config's port range: Ray's blocks never take it
JOB = ["--set", "scaling.num_workers=2", "--set", "train.epochs=1", "--set", "run.tensorboard=false"]


def first_step(run_dir: Path, launched: float) -> float:
    return startup_records(str(run_dir / "metrics.jsonl"))[0]["first_step"] - launched


def ray_round(
    cluster, job, storage: Path, name: str, engine: str = "ray_train", submit: bool = True, working_dir: bool = True
) -> dict:
    launched = time.time()
    driver = [
        "python",
        "jobs/sync.py",
        *JOB,
        "--set",
        f"scaling.engine={engine}",
        "--set",
        f"run.storage_path={storage}",
        "--set",
        f"run.name={name}",
    ]
    upload = ["--working-dir", "."] if working_dir else []
    r = cluster.run(
        "master-node",
        ["ray", "job", "submit", *upload, "--", *driver] if submit else [sys.executable, *driver[1:]],
        env=job.env(),
        timeout=600,
    )
    if r.returncode != 0:
        raise SystemExit(f"ray job submit failed: {(r.stdout + r.stderr)[-3000:]}")
    took = first_step(storage / name, launched)
    # The driver's own split, from its process start: what came before it is `ray job submit`'s and the job's.
    summary = json.loads((storage / name / "summary.json").read_text())
    up = summary["startup_s"]
    print(f"  {engine}: submit to driver start {took - up['first_step']:.1f} s, then {up}", flush=True)
    return {
        "first_step_s": round(took, 2),
        "to_driver_start_s": round(took - up["first_step"], 2),
        "startup_s": up,
        "warm_workers": summary.get("warm_workers", 0),
    }


def torchrun_round(cluster, job, storage: Path, name: str) -> float:
    hosts = list(cluster.hosts.values())
    # What a hand-written sbatch script does: each node's interface by name, rank 0's address for rendezvous.
    cases = " ".join(f"{h.name}) IF={h.iface};;" for h in hosts)
    sets = " ".join(JOB + ["--set", f"run.storage_path={storage}", "--set", f"run.name={name}"])
    script = (
        f"case $(hostname) in {cases} esac; export GLOO_SOCKET_IFNAME=$IF; "
        f"exec {sys.executable} -m torch.distributed.run --nnodes=2 --nproc-per-node=1 "
        f"--node-rank=$SLURM_NODEID --master-addr={hosts[0].ip} --master-port={PORT} "
        f"benchmarks/torchrun_sync.py {sets}"
    )
    launched = time.time()
    r = cluster.run(
        "master-node",
        [
            "srun",
            f"--jobid={job.job_id}",
            "--overlap",
            "--nodes=2",
            "--ntasks-per-node=1",
            f"--nodelist={hosts[0].name},{hosts[1].name}",
            "bash",
            "-c",
            script,
        ],
        timeout=600,
    )
    if r.returncode != 0:
        raise SystemExit(f"srun torchrun failed: {(r.stdout + r.stderr)[-3000:]}")
    return {"first_step_s": round(first_step(storage / name, launched), 2)}


def rounds(n: int) -> list[dict]:
    from tests.support.cluster import rayup
    from tests.support.cluster.emucluster import EmulatedCluster

    rows = []
    with EmulatedCluster() as cluster:
        job = rayup.submit(cluster, rayup.write_config(cluster, "first-step"))
        job.wait_for("Ray cluster ready", timeout=180)
        storage = cluster.shared / "runs"
        sides = {
            "ray": lambda name: ray_round(cluster, job, storage, name),
            "launch": lambda name: ray_round(cluster, job, storage, name, engine="launch"),
            "shared": lambda name: ray_round(cluster, job, storage, name, engine="launch", working_dir=False),
            "direct": lambda name: ray_round(cluster, job, storage, name, engine="launch", submit=False),
            "torchrun": lambda name: torchrun_round(cluster, job, storage, name),
        }
        order = list(sides)
        for i in range(n):
            got = {"round": i}
            for which in order[i % len(order) :] + order[: i % len(order)]:  # rotated: a drift in load favours no side
                got[which] = sides[which](f"{which}{i}")
            rows.append(got)
            print(f"round {i + 1}: " + ", ".join(f"{k} {got[k]['first_step_s']:.1f} s" for k in order), flush=True)
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
    return rows


def _ratio(r: dict, side: str = "ray") -> float:
    return r[side]["first_step_s"] / r["torchrun"]["first_step_s"]


def report(stored: dict) -> str:
    """docs/benchmarks.md's table of the rounds, and each Ray side's split (median, min-max)."""
    rows = stored["rounds"]
    sides = [s for s in ("ray", "launch", "shared", "direct") if s in rows[0]]
    names = {
        "ray": "`ray job submit`",
        "launch": "`ray job submit`, scaling.engine=launch",
        "shared": "`ray job submit` without `--working-dir`, scaling.engine=launch",
        "direct": "driver after `raydist env`, scaling.engine=launch",
    }
    out = [
        "| round | "
        + " | ".join(names[s] for s in sides)
        + " | `srun` + `torchrun` | "
        + " | ".join(f"ratio{'' if s == 'ray' else ', ' + s}" for s in sides)
        + " |",
        "|---|" + "---|" * (2 * len(sides) + 1),
    ]
    for r in rows:
        out.append(
            f"| {r['round'] + 1} | "
            + " | ".join(f"{r[s]['first_step_s']:.1f} s" for s in sides)
            + f" | {r['torchrun']['first_step_s']:.1f} s | "
            + " | ".join(f"{_ratio(r, s):.2f}" for s in sides)
            + " |"
        )
    out.append(
        "| median | "
        + "| " * (len(sides) + 1)
        + " | ".join(f"{statistics.median(_ratio(r, s) for r in rows):.2f}" for s in sides)
        + " |"
    )
    for s in sides:
        up = [r[s]["startup_s"] for r in rows]
        submitted = (
            ""
            if s == "direct"
            else (
                f"the command's launch to the driver's process start {stored_file.spread([r[s]['to_driver_start_s'] for r in rows])}; then "
            )
        )
        out += [
            "",
            f"{names[s][0].upper() + names[s][1:]}, in seconds, median (min-max): {submitted}from the driver's start, connected at "
            f"{stored_file.spread([u['connect'] for u in up])}, the workers' function entered at {stored_file.spread([u['workers'] for u in up])}, "
            f"the first step done at {stored_file.spread([u['first_step'] for u in up])}.",
        ]
    return "\n".join(out) + "\n"


def main() -> int:
    p = stored_file.parser(__doc__.splitlines()[0], rounds=3)
    stored_file.add_options(p, "docs/data/first_step.json")
    a = p.parse_args()
    if stored_file.print_report(a.report, report):
        return 0
    machine_and_commit = stored_file.stamp()
    rows = rounds(a.rounds)
    print(
        json.dumps(
            {
                "rounds": a.rounds,
                "ratio": round(statistics.median(_ratio(r) for r in rows), 2),
                "launch_ratio": round(statistics.median(_ratio(r, "launch") for r in rows), 2),
                "shared_ratio": round(statistics.median(_ratio(r, "shared") for r in rows), 2),
                "direct_ratio": round(statistics.median(_ratio(r, "direct") for r in rows), 2),
            }
        )
    )
    stored_file.save(a.out, {"rounds": rows}, machine_and_commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
