"""Does a finished DDP script exit? The same script (tests/launch_scripts/ddp_teardown.py: gloo, DistributedSampler,
destroy_process_group() with the DDP model alive, then a plain return) on the 3 emulated SLURM hosts, each round in
alternating order: plain srun, `raydist launch` (fresh interpreters, the default) and `raydist launch --set
warm=true` (ranks forked from each node's warm interpreter).

    flock /tmp/raydist-heavy.lock .venv/bin/python -m benchmarks.exit_faults --rounds 20 --out docs/data/exit_faults.json

Per run: whether every rank printed its last line; whether the command then exited within BOUND_S (a hang in
interpreter teardown otherwise: srun's step is ended by its time limit, raydist names it as an exit fault after
exit_timeout_s); whether a rank died after its last line (srun: a non-zero exit after every last line; raydist: an
exit fault by a signal); and the seconds from the last of the last lines to the command's exit. Counted by this
script from each command's output and raydist's summary.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.stored import parser, stamp

REPO = Path(__file__).resolve().parents[1]

SCRIPT = "tests/launch_scripts/ddp_teardown.py"
BOUND_S = 60.0  # after the last rank's last line; raydist's exit_timeout_s is set to it
PORT = 19558


def watched(argv: list[str], env: dict[str, str], hosts: int) -> dict:
    """Run argv; when each rank's last line came, when the command exited, its code and output tail."""
    import subprocess

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    last, tail = {}, []
    assert proc.stdout is not None
    for line in proc.stdout:
        if "LAST LINE rank " in line:
            last[line.split("LAST LINE rank ")[1].split()[0]] = time.monotonic() - t0
        tail = (tail + [line.rstrip()])[-30:]
    code = proc.wait()
    ended = time.monotonic() - t0
    every = len(last) == hosts
    return {
        "exit_code": code,
        "last_lines": len(last),
        "after_last_line_s": round(ended - max(last.values()), 2) if every else None,
        "total_s": round(ended, 2),
        "tail": tail[-8:],
    }


def judged(run: dict, mode: str, summary: dict | None) -> dict:
    """hung: did not exit within BOUND_S of the last line; died: a rank ended by a signal (or abort) after it."""
    every = run["after_last_line_s"] is not None
    text = "\n".join(run["tail"])
    if mode == "srun":
        hung = every and ("TIME LIMIT" in text or run["after_last_line_s"] > BOUND_S)
        died = every and not hung and run["exit_code"] != 0
    else:
        faults = [r.get("exit_fault", "") for r in (summary or {}).get("ranks", [])]
        hung = any("did not exit" in f for f in faults)
        died = any("killed by signal" in f for f in faults)
    return {
        **run,
        "completed_training": every,
        "hung": bool(hung),
        "died_after_last_line": bool(died),
        "status": (summary or {}).get("status"),
    }


def rounds(n: int) -> tuple[list[dict], int]:
    from tests.support.cluster import rayup
    from tests.support.cluster.emucluster import EmulatedCluster

    out = []
    with EmulatedCluster() as cluster:
        hosts = list(cluster.hosts.values())
        job = rayup.submit(cluster, rayup.write_config(cluster, "exit-faults"))
        job.wait_for("Ray cluster ready", timeout=180)
        runs_dir = cluster.shared / "exit-faults"
        cases = " ".join(f"{h.name}) IF={h.iface};;" for h in hosts)

        def in_head(argv: list[str]) -> list[str]:
            return [*cluster.nsenter("master-node"), "env", "-C", str(REPO), *argv]

        def srun(i: int) -> dict:
            script = (
                f"case $(hostname) in {cases} esac; export GLOO_SOCKET_IFNAME=$IF MASTER_ADDR={hosts[0].ip} "
                f"MASTER_PORT={PORT} OMP_NUM_THREADS=1; exec python {SCRIPT}"
            )
            argv = [
                "srun",
                f"--jobid={job.job_id}",
                "--overlap",
                f"--nodes={len(hosts)}",
                "--ntasks-per-node=1",
                "--time=2",
                "bash",
                "-c",
                script,
            ]
            return judged(watched(in_head(argv), cluster.env(), len(hosts)), "srun", None)

        def launch(i: int, mode: str, *options: str) -> dict:
            name = f"{mode}{i}"
            argv = [
                "raydist",
                "launch",
                "--workers",
                str(len(hosts)),
                "--output",
                "all",
                "--max-restarts",
                "0",
                "--storage",
                str(runs_dir),
                "--name",
                name,
                "--set",
                f"exit_timeout_s={BOUND_S:g}",
                *options,
                "--",
                "python",
                SCRIPT,
            ]
            run = watched(in_head(argv), job.env(), len(hosts))
            path = runs_dir / name / "summary.json"
            return judged(run, mode, json.loads(path.read_text()) if path.exists() else None)

        modes = {
            "srun": srun,
            "launch_fresh": lambda i: launch(i, "launch_fresh"),
            "launch_warm": lambda i: launch(i, "launch_warm", "--set", "warm=true"),
        }
        for i in range(n):
            order = list(modes) if i % 2 == 0 else list(reversed(modes))
            got = {name: modes[name](i) for name in order}
            out.append({"order": order, **got})
            print(
                f"round {i + 1}: "
                + json.dumps(
                    {
                        k: {x: v[x] for x in ("exit_code", "after_last_line_s", "hung", "died_after_last_line")}
                        for k, v in got.items()
                        if k != "order"
                    }
                ),
                flush=True,
            )
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
    return out, len(hosts)


def counts(rows: list[dict]) -> dict:
    out = {}
    for mode in ("srun", "launch_fresh", "launch_warm"):
        runs = [r[mode] for r in rows]
        after = sorted(r["after_last_line_s"] for r in runs if r["after_last_line_s"] is not None)
        out[mode] = {
            "runs": len(runs),
            "completed_training": sum(r["completed_training"] for r in runs),
            "hung": sum(r["hung"] for r in runs),
            "died_after_last_line": sum(r["died_after_last_line"] for r in runs),
            "after_last_line_s": {"median": after[len(after) // 2], "min": after[0], "max": after[-1]}
            if after
            else None,
        }
    return out


def report(stored: dict) -> str:
    rows = [
        "| how the ranks start | runs | training completed | hung after the last line | died after it | "
        "last line to exit, s |",
        "|---|---|---|---|---|---|",
    ]
    names = {
        "srun": "plain srun",
        "launch_fresh": "`raydist launch` (fresh interpreters, the default)",
        "launch_warm": "`raydist launch --set warm=true` (forked)",
    }
    for mode, c in stored["counts"].items():
        a = c["after_last_line_s"]
        spread = f"{a['median']:.2f} ({a['min']:.2f}-{a['max']:.2f})" if a else "-"
        rows.append(
            f"| {names[mode]} | {c['runs']} | {c['completed_training']} | {c['hung']} | "
            f"{c['died_after_last_line']} | {spread} |"
        )
    return (
        "\n".join(rows) + f"\n\n{len(stored['rounds'])} rounds, {stored['date']}, commit {stored['commit'][:12]}, "
        f"{stored['machine']['cpus']} CPUs, 3 emulated hosts\n"
    )


def main() -> int:
    p = parser(__doc__.splitlines()[0], rounds=20)
    p.add_argument("--out", default=str(REPO / "docs" / "data" / "exit_faults.json"))
    p.add_argument("--table", action="store_true", help="print the docs' table from --out, run nothing")
    a = p.parse_args()
    if a.table:
        print(report(json.loads(Path(a.out).read_text())), end="")
        return 0
    stamped = stamp()  # the tree the rounds run from: taken before them, as an edit meanwhile would not count
    rows, hosts = rounds(a.rounds)
    stored = {
        "setting": {"hosts": hosts, "script": SCRIPT, "bound_s": BOUND_S},
        "counts": counts(rows),
        "rounds": rows,
        **stamped,
    }
    Path(a.out).write_text(json.dumps(stored, indent=1) + "\n")
    print(report(stored), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
