"""Is `raydist doctor`'s all-reduce figure right? Against a raw torch.distributed loop on the same hosts.

    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.doctor_allreduce --rounds 5 --bytes 16MiB --iters 10
    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.doctor_allreduce --rounds 5 --link-mbit 1000
    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.doctor_allreduce --rounds 5 --link-mbit 1000 \
        --out docs/data/doctor_allreduce.json                                    # stored, as docs/doctor.md quotes
    .venv/bin/python -m benchmarks.doctor_allreduce --report docs/data/doctor_allreduce.json   # the docs' table

(root: it builds the emulated 3-host SLURM cluster of tests/support/cluster/emucluster.py and brings Ray up on it with
cluster/ray_up.slurm). Each round runs, in alternating order, `raydist doctor --json` on master-node (its agents
are Ray actors, one per host) and three plain processes, one per host, that time `dist.all_reduce` in a loop over
gloo on each host's own interface, written here without any raydist code. Both report the same bus bandwidth
(2(n-1)/n x bytes / slowest rank's time per iteration). Prints every round, the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import stored as stored_file

REPO = Path(__file__).resolve().parents[1]

RAW_PORT = 19555  # below the cluster config's port range: Ray's blocks never take it


def raw_rank(rank: int, world: int, master: str, nbytes: int, iters: int) -> None:
    """One rank of the raw loop: the textbook way, no raydist."""
    import datetime

    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://{master}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )
    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    dist.all_reduce(buf)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        per_iter = elapsed.item() / iters
        print(
            json.dumps(
                {"bus_gbps": 2 * (world - 1) / world * buf.numel() * 4 * 8 / per_iter / 1e9, "seconds": per_iter}
            ),
            flush=True,
        )
    dist.destroy_process_group()


def run_raw(cluster, nbytes: int, iters: int) -> float:
    hosts = list(cluster.hosts.values())
    master = f"{hosts[0].ip}:{RAW_PORT}"
    procs = []
    for rank, h in enumerate(hosts):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.doctor_allreduce",
            "--raw-rank",
            str(rank),
            "--world",
            str(len(hosts)),
            "--master",
            master,
            "--bytes",
            str(nbytes),
            "--iters",
            str(iters),
        ]
        procs.append(
            cluster.popen(
                h.name,
                cmd,
                env=cluster.env(GLOO_SOCKET_IFNAME=h.iface),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"raw rank failed ({p.returncode}): {err[-2000:]}")
    return json.loads(outs[0][0].strip().splitlines()[-1])["bus_gbps"]


def run_doctor(cluster, job, nbytes: int, iters: int, show: bool) -> float:
    r = cluster.run(
        "master-node",
        ["raydist", "doctor", "--json", "--bytes", str(nbytes), "--iters", str(iters)],
        env=job.env(),
        timeout=300,
    )
    if r.returncode != 0:
        raise SystemExit(f"doctor exited {r.returncode}: {r.stderr[-2000:]}")
    if show:
        table = cluster.run(
            "master-node",
            ["raydist", "doctor", "--bytes", str(nbytes), "--iters", str(iters)],
            env=job.env(),
            timeout=300,
        )
        print(table.stdout, flush=True)
    return json.loads(r.stdout)["bandwidth"]["allreduce_bus_gbps"]


def report(stored: dict) -> str:
    """The table docs/doctor.md quotes: every round, and the medians (the ratio's is the median of the rounds')."""
    rows = ["| round | order | doctor | raw torch.distributed | ratio |", "|---|---|---|---|---|"]
    for i, r in enumerate(stored["rounds"]):
        rows.append(
            f"| {i + 1} | {r['order']} first | {r['doctor']:.3f} | {r['raw']:.3f} | {r['doctor'] / r['raw']:.3f} |"
        )
    med = {k: statistics.median(r[k] for r in stored["rounds"]) for k in ("doctor", "raw")}
    ratio = statistics.median(r["doctor"] / r["raw"] for r in stored["rounds"])
    rows.append(f"| median | | {med['doctor']:.3f} | {med['raw']:.3f} | **{ratio:.3f}** |")
    close = sum(abs(r["doctor"] / r["raw"] - 1) <= 0.1 for r in stored["rounds"])
    link = stored["link_mbit"]
    return "\n".join(rows) + (
        f"\n\nDoctor's figure is within 10% of the raw loop in {close} of {len(stored['rounds'])} rounds"
        + (
            f"; the raw loop's median is {med['raw'] / (link / 1e3):.1%} of the {link:g} Mbit/s link (ring "
            f"all-reduce's bus bandwidth)"
            if link
            else ""
        )
        + ".\n"
    )


def measure(cluster, job, a, nbytes: int) -> list[dict]:
    rounds = []
    for i in range(a.rounds):
        # Alternate which goes first, so a drift in the machine's load does not favour one side.
        order = ("doctor", "raw") if i % 2 == 0 else ("raw", "doctor")
        got = {}
        for which in order:
            got[which] = (
                run_doctor(cluster, job, nbytes, a.iters, show=i == 0)
                if which == "doctor"
                else run_raw(cluster, nbytes, a.iters)
            )
        rounds.append({"order": order[0], "doctor": round(got["doctor"], 4), "raw": round(got["raw"], 4)})
        print(
            f"round {i + 1}: doctor {got['doctor']:.3f} Gb/s, raw torch.distributed {got['raw']:.3f} Gb/s, "
            f"ratio {got['doctor'] / got['raw']:.3f}",
            flush=True,
        )
    return rounds


def main() -> int:
    p = stored_file.parser(__doc__.splitlines()[0], rounds=5)
    p.add_argument("--bytes", default="16MiB")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument(
        "--link-mbit",
        type=float,
        help="shape every host's link to this many Mbit/s each way "
        "(tests/support/cluster/emucluster.py shape); default: unshaped",
    )
    p.add_argument("--raw-rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    stored_file.add_options(p, "docs/data/doctor_allreduce.json")
    a = p.parse_args()
    if stored_file.print_report(a.report, report):
        return 0
    from raydist.slurm.settings import parse_size

    nbytes = parse_size(a.bytes, "--bytes")
    if a.raw_rank is not None:
        raw_rank(a.raw_rank, a.world, a.master, nbytes, a.iters)
        return 0

    from tests.support.cluster import rayup
    from tests.support.cluster.emucluster import EmulatedCluster

    machine_and_commit = stored_file.stamp()
    with EmulatedCluster() as cluster:
        job = rayup.submit(cluster, rayup.write_config(cluster, "doctor-bench"))
        job.wait_for("Ray cluster ready", timeout=180)
        if a.link_mbit:
            cluster.shape(a.link_mbit)
        result = {
            "bytes": a.bytes,
            "iters": a.iters,
            "hosts": len(cluster.hosts),
            "link_mbit": a.link_mbit or 0,
            "rounds": measure(cluster, job, a, nbytes),
        }
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
    print(report(result), end="", flush=True)
    stored_file.save(a.out, result, machine_and_commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
