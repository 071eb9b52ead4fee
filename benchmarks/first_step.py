"""Time to the first step on a warm Ray cluster against `srun` + `torchrun` started cold on the same hosts.

    flock /tmp/raydist-emu.lock .venv/bin/python benchmarks/first_step.py --rounds 3

(root: it builds the emulated 3-host SLURM cluster of tests/cluster/emucluster.py and brings Ray up on it with
cluster/ray_up.slurm, which then stays up: the warm cluster.) Each round, in alternating order:

- Ray: `ray job submit --working-dir . -- python jobs/sync.py` from master-node, 2 workers;
- srun + torchrun: the hand-written way, a job step inside the same allocation (`srun --overlap`) on 2 hosts, each
  picking its interface in a `case` on its host name, `torchrun` with a static master address running the same
  loop (benchmarks/torchrun_sync.py).

Both run 1 epoch of digits and write the loop's `startup` record (raydist.train.loop) to metrics.jsonl on the
shared storage; the time to the first step is that record's `first_step` minus the moment this script launched the
command (one clock: the emulated hosts share the machine's). Prints each round, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raydist.observability.metrics import startup_records  # noqa: E402
PORT = 19556  # below the cluster config's port range: Ray's blocks never take it
JOB = ["--set", "scaling.num_workers=2", "--set", "train.epochs=1", "--set", "run.tensorboard=false"]


def first_step(run_dir: Path, launched: float) -> float:
    return startup_records(str(run_dir / "metrics.jsonl"))[0]["first_step"] - launched


def ray_round(cluster, job, storage: Path, name: str) -> float:
    launched = time.time()
    r = cluster.run("master-node", ["ray", "job", "submit", "--working-dir", ".", "--", "python", "jobs/sync.py",
                                    *JOB, "--set", f"run.storage_path={storage}", "--set", f"run.name={name}"],
                    env=job.env(), timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"ray job submit failed: {(r.stdout + r.stderr)[-3000:]}")
    took = first_step(storage / name, launched)
    # The driver's own split, from its process start: what came before it is `ray job submit`'s and the job's.
    up = json.loads((storage / name / "summary.json").read_text())["startup_s"]
    print(f"  ray: submit to driver start {took - up['first_step']:.1f} s, then {up}", flush=True)
    return took


def torchrun_round(cluster, job, storage: Path, name: str) -> float:
    hosts = list(cluster.hosts.values())
    # What a hand-written sbatch script does: each node's interface by name, rank 0's address for rendezvous.
    cases = " ".join(f"{h.name}) IF={h.iface};;" for h in hosts)
    sets = " ".join(JOB + ["--set", f"run.storage_path={storage}", "--set", f"run.name={name}"])
    script = (f"case $(hostname) in {cases} esac; export GLOO_SOCKET_IFNAME=$IF; "
              f"exec {sys.executable} -m torch.distributed.run --nnodes=2 --nproc-per-node=1 "
              f"--node-rank=$SLURM_NODEID --master-addr={hosts[0].ip} --master-port={PORT} "
              f"benchmarks/torchrun_sync.py {sets}")
    launched = time.time()
    r = cluster.run("master-node", ["srun", f"--jobid={job.job_id}", "--overlap", "--nodes=2", "--ntasks-per-node=1",
                                    f"--nodelist={hosts[0].name},{hosts[1].name}", "bash", "-c", script],
                    timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"srun torchrun failed: {(r.stdout + r.stderr)[-3000:]}")
    return first_step(storage / name, launched)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    sys.path.insert(0, str(REPO / "tests" / "cluster"))
    import rayup
    from emucluster import EmulatedCluster

    rows = []
    with EmulatedCluster() as cluster:
        job = rayup.submit(cluster, rayup.write_config(cluster, "first-step"))
        job.wait_for("Ray cluster ready", timeout=180)
        storage = cluster.shared / "runs"
        for i in range(a.rounds):
            order = ("ray", "torchrun") if i % 2 == 0 else ("torchrun", "ray")
            got = {}
            for which in order:
                fn = ray_round if which == "ray" else torchrun_round
                got[which] = fn(cluster, job, storage, f"{which}{i}")
            rows.append(got)
            print(f"round {i + 1}: ray job submit {got['ray']:.1f} s, srun + torchrun {got['torchrun']:.1f} s, "
                  f"ratio {got['ray'] / got['torchrun']:.2f}", flush=True)
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
    ray = statistics.median(r["ray"] for r in rows)
    tr = statistics.median(r["torchrun"] for r in rows)
    print(json.dumps({"rounds": a.rounds, "ray_first_step_s": round(ray, 2), "torchrun_first_step_s": round(tr, 2),
                      "ratio": round(statistics.median(r["ray"] / r["torchrun"] for r in rows), 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
