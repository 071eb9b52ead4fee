"""`raydist launch` of examples/ddp_train.py against torchrun and srun of the same script, side by side.

    .venv/bin/python -m benchmarks.launch_first_step --rounds 5                    # this machine: against torchrun
    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.launch_first_step --cluster --rounds 3
                                       # root: a warm Ray cluster on the 3 emulated SLURM hosts, against srun

Local, each round in alternating order: `torchrun --standalone --nproc-per-node 2 examples/ddp_train.py` and
`raydist launch --workers 2 -- python examples/ddp_train.py` (which starts its embedded Ray instance).
Cluster: cluster/ray_up.slurm brings Ray up on the emulated hosts once (the warm cluster); each round, in alternating
order, the hand-written way (an `srun --overlap` step on the 3 hosts, each picking its interface in a `case`, as
examples/srun_before.sbatch), `raydist launch` from the head node with the cluster's address (as after
`eval "$(raydist env)"`; fresh interpreters, the default), the same with `--set warm=true` (ranks forked from the
nodes' warm interpreters, torch already imported), and `ray job submit -- raydist launch`.

`ray job submit`'s command-line tool runs with PYTHONUNBUFFERED=1, as at a terminal: into a pipe, Python holds
all of its output back until it exits (the job's log lines included), which is not what a user at a terminal sees.

Timed from this script's launch of the command: the arrival of the script's "step 1" line on the command's output
(the first step, as the user sees it) and the command's exit. Writes every round, the machine and the commit to
docs/data/launch_first_step.json (--out), and prints the ratios' medians and ranges.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.stored import parser, stamp

REPO = Path(__file__).resolve().parents[1]

BIN = Path(sys.executable).parent
SCRIPT_ARGS = ["--epochs", "1"]
PORT = 19557  # the srun side's MASTER_PORT: below the cluster config's port range


def timed(argv: list[str], env: dict[str, str] | None = None, cwd: Path = REPO, marker: str = "step 1 ") -> dict:
    """Run argv; seconds to the first output line holding `marker`, and to the exit."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first, tail = None, []
    assert proc.stdout is not None
    for line in proc.stdout:
        if first is None and marker in line:
            first = time.monotonic() - t0
        tail = (tail + [line])[-20:]
    code = proc.wait()
    if code != 0 or first is None:
        raise SystemExit(
            f"{' '.join(argv[:6])}... exited {code}{'' if first else ' without a first step'}:\n" + "".join(tail)
        )
    return {"first_step_s": round(first, 3), "total_s": round(time.monotonic() - t0, 3)}


def split(run_dir: Path) -> dict[str, float]:
    """raydist launch's own start-up split (summary.json's startup_s: seconds since its process started), and how
    many ranks its nodes' warm interpreters forked."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**summary["startup_s"], "warm_ranks": sum(bool(r.get("warm")) for r in summary["ranks"])}


def local_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", TMPDIR=str(tmp))
    return env


def local_rounds(rounds: int) -> list[dict]:
    out = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="lfs-", dir="/tmp") as d:
            tmp = Path(d)
            script = [str(REPO / "examples" / "ddp_train.py"), *SCRIPT_ARGS, "--snapshot", str(tmp / "s.pt")]
            runs = {
                "torchrun": lambda: timed(
                    [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *script], local_env(tmp)
                ),
                "raydist_launch": lambda: {
                    **timed(
                        [
                            str(BIN / "raydist"),
                            "launch",
                            "--workers",
                            "2",
                            "--storage",
                            str(tmp / "runs"),
                            "--name",
                            "l",
                            "--",
                            "python",
                            *script,
                        ],
                        local_env(tmp),
                    ),
                    "split": split(tmp / "runs" / "l"),
                },
            }
            order = list(runs) if i % 2 == 0 else list(reversed(runs))
            got = {}
            for name in order:
                (tmp / "s.pt").unlink(missing_ok=True)
                got[name] = runs[name]()
            out.append({"order": order, **got})
            print(f"round {i + 1}: {json.dumps(got)}", flush=True)
    return out


def cluster_rounds(rounds: int) -> tuple[list[dict], int]:
    from tests.support.cluster import rayup
    from tests.support.cluster.emucluster import EmulatedCluster

    out = []
    with EmulatedCluster() as cluster:
        hosts = list(cluster.hosts.values())
        job = rayup.submit(cluster, rayup.write_config(cluster, "launch-first-step"))
        job.wait_for("Ray cluster ready", timeout=180)
        shared = cluster.shared / "lfs"
        shared.mkdir(exist_ok=True)
        cases = " ".join(f"{h.name}) IF={h.iface};;" for h in hosts)

        def in_head(argv: list[str], env: dict[str, str]) -> dict:
            return timed([*cluster.nsenter("master-node"), "env", "-C", str(REPO), *argv], env)

        def srun(i: int) -> dict:
            snap = shared / f"srun{i}.pt"
            script = (
                f"case $(hostname) in {cases} esac; export GLOO_SOCKET_IFNAME=$IF NCCL_SOCKET_IFNAME=$IF "
                f"MASTER_ADDR={hosts[0].ip} MASTER_PORT={PORT} OMP_NUM_THREADS=1; "
                f"exec python examples/ddp_train.py {' '.join(SCRIPT_ARGS)} --snapshot {snap}"
            )
            return in_head(
                [
                    "srun",
                    f"--jobid={job.job_id}",
                    "--overlap",
                    f"--nodes={len(hosts)}",
                    "--ntasks-per-node=1",
                    "bash",
                    "-c",
                    script,
                ],
                cluster.env(),
            )

        def launch(i: int, name: str = "direct", *options: str) -> dict:
            got = in_head(
                [
                    "raydist",
                    "launch",
                    "--workers",
                    str(len(hosts)),
                    "--storage",
                    str(shared / "runs"),
                    "--name",
                    f"{name}{i}",
                    *options,
                    "--",
                    "python",
                    "examples/ddp_train.py",
                    *SCRIPT_ARGS,
                    "--snapshot",
                    str(shared / f"{name}{i}.pt"),
                ],
                job.env(),
            )
            return {**got, "split": split(shared / "runs" / f"{name}{i}")}

        def launch_warm(i: int) -> dict:  # opt-in: ranks forked from the nodes' warm interpreters
            return launch(i, "warm", "--set", "warm=true")

        def submit(i: int) -> dict:
            got = in_head(
                [
                    "ray",
                    "job",
                    "submit",
                    "--working-dir",
                    ".",
                    "--",
                    "raydist",
                    "launch",
                    "--workers",
                    str(len(hosts)),
                    "--storage",
                    str(shared / "runs"),
                    "--name",
                    f"submit{i}",
                    "--",
                    "python",
                    "examples/ddp_train.py",
                    *SCRIPT_ARGS,
                    "--snapshot",
                    str(shared / f"submit{i}.pt"),
                ],
                {**job.env(), "PYTHONUNBUFFERED": "1"},
            )
            return {**got, "split": split(shared / "runs" / f"submit{i}")}

        runs = {
            "srun": srun,
            "raydist_launch": launch,
            "raydist_launch_warm": launch_warm,
            "ray_job_submit_launch": submit,
        }
        for i in range(rounds):
            order = list(runs) if i % 2 == 0 else list(reversed(runs))
            got = {name: runs[name](i) for name in order}
            out.append({"order": order, **got})
            print(f"round {i + 1}: {json.dumps(got)}", flush=True)
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
    return out, len(hosts)


def ratios(rows: list[dict], base: str) -> dict:
    out = {}
    for name in rows[0]:
        if name in ("order", base):
            continue
        for what in ("first_step_s", "total_s"):
            r = [row[name][what] / row[base][what] for row in rows]
            out[f"{name}/{base} {what}"] = {
                "median": round(statistics.median(r), 2),
                "min": round(min(r), 2),
                "max": round(max(r), 2),
            }
        for what in ("connected", "placed", "started", "first_output", "first_step"):
            v = [row[name]["split"][what] for row in rows if what in row[name].get("split", {})]
            if v:
                out[f"{name} split {what}"] = {"median": round(statistics.median(v), 2), "min": min(v), "max": max(v)}
        for what in ("first_step_s", "total_s"):
            for who in (name, base):
                v = [row[who][what] for row in rows]
                out[f"{who} {what}"] = {"median": round(statistics.median(v), 2), "min": min(v), "max": max(v)}
    return out


ROWS = (
    ("local", "raydist_launch", "torchrun", "this machine, 2 ranks", "`raydist launch` (embedded Ray)"),
    ("cluster", "raydist_launch", "srun", "warm cluster, 3 hosts", "`raydist launch` (after `raydist env`)"),
    ("cluster", "raydist_launch_warm", "srun", "warm cluster, 3 hosts", "`raydist launch --set warm=true`"),
    ("cluster", "ray_job_submit_launch", "srun", "warm cluster, 3 hosts", "`ray job submit -- raydist launch`"),
)


def _range(v: dict) -> str:
    return f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"


def markdown(stored: dict) -> str:
    """docs/benchmarks.md's tables, from the stored result (a test keeps the two equal)."""
    rows = [
        "| where | command | against | its first step, s | first step, s | ratio | whole command, ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, name, base, where, what in ROWS:
        if f"{name}/{base} first_step_s" not in stored.get(part, {}).get("summary", {}):
            continue  # not in that stored run
        m = stored[part]["summary"]
        rows.append(
            f"| {where} | {what} | {stored[part]['setting']['baseline']} | {_range(m[f'{base} first_step_s'])} "
            f"| {_range(m[f'{name} first_step_s'])} | {_range(m[f'{name}/{base} first_step_s'])} "
            f"| {_range(m[f'{name}/{base} total_s'])} |"
        )
    rows += [
        "",
        "| where | command | connected | placed | started | first output | first step |",
        "|---|---|---|---|---|---|---|",
    ]
    for part, name, _, where, what in ROWS:
        m = stored.get(part, {}).get("summary", {})
        if f"{name} split first_step" in m:
            rows.append(
                f"| {where} | {what} | "
                + " | ".join(
                    _range(m[f"{name} split {k}"])
                    for k in ("connected", "placed", "started", "first_output", "first_step")
                )
                + " |"
            )
    rounds = {part: len(stored[part]["rounds"]) for part in ("local", "cluster") if part in stored}
    return (
        "\n".join(rows)
        + "\n\n"
        + "; ".join(
            f"{part}: {n} rounds, {stored[part]['date']}, commit {stored[part]['commit'][:12]}, "
            f"{stored[part]['machine']['cpus']} CPUs"
            for part, n in rounds.items()
        )
        + "\n"
    )


def main() -> int:
    p = parser(__doc__.splitlines()[0], rounds=5)
    p.add_argument("--table", action="store_true", help="print docs/benchmarks.md's tables from --out, run nothing")
    p.add_argument("--cluster", action="store_true", help="the emulated SLURM cluster (root) instead of this machine")
    p.add_argument("--out", default=str(REPO / "docs" / "data" / "launch_first_step.json"))
    a = p.parse_args()
    path = Path(a.out)
    stored = json.loads(path.read_text()) if path.exists() else {}
    if a.table:
        print(markdown(stored), end="")
        return 0
    if a.cluster:
        rows, hosts = cluster_rounds(a.rounds)
        part = {
            "setting": {"hosts": hosts, "workers": hosts, "script_args": SCRIPT_ARGS, "baseline": "srun"},
            "rounds": rows,
            "summary": ratios(rows, "srun"),
        }
    else:
        rows = local_rounds(a.rounds)
        part = {
            "setting": {"workers": 2, "script_args": SCRIPT_ARGS, "baseline": "torchrun --standalone"},
            "rounds": rows,
            "summary": ratios(rows, "torchrun"),
        }
    part.update(stamp())
    stored["cluster" if a.cluster else "local"] = part
    path.write_text(json.dumps(stored, indent=1) + "\n")
    print(json.dumps(part["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
