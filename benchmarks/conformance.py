"""The conformance matrix: each script of tests/conformance/ under every launcher, rounds in a row, counting results
that differ from the baseline's and runs that hang (no exit within BOUND_S).

    flock /tmp/raydist-heavy.lock .venv/bin/python -m benchmarks.conformance --rounds 2 --out docs/data/conformance.json

This machine, 2 ranks: torchrun --standalone (the baseline) and `raydist launch` on the embedded instance; faults on
the FSDP2 script: a rank SIGKILLed mid-run (raydist restarts the group; the script starts over, same result) and
SIGTERM to raydist launch (the time-limit signal: the script's own snapshot), then the same command (it resumes;
same result). The 3 emulated SLURM hosts (root): srun (the baseline, each host picking its interface in a `case`),
`raydist launch` from a login shell on a warm cluster, and batch mode (`sbatch cluster/ray_up.slurm raydist launch`).
Each result: steps, loss and parameters' checksum as the script prints them, and the environment its framework
detected.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.stored import parser, stamp
from tests.conformance import harness

REPO = Path(__file__).resolve().parents[1]

BOUND_S = 300.0
BIN = Path(sys.executable).parent


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "TMPDIR": str(work)}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """One command to its end, or BOUND_S: its result line, exit code, whether it hung."""
    try:
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        return {"hung": True}
    try:
        return {"hung": False, "exit_code": r.returncode, **harness.finished(r.returncode, r.stdout + r.stderr)}
    except AssertionError:
        return {"hung": False, "exit_code": r.returncode, "tail": (r.stdout + r.stderr)[-1500:]}


def _killed_mid_run(work: Path) -> dict:
    """raydist launch of the FSDP2 script with rank 1 SIGKILLed after step 10: the group restarts."""
    argv = harness.launch_argv("fsdp2_dcp", work, 2, "kill", "--output", "all") + ["0.1"]
    proc = subprocess.Popen(argv, cwd=work, env=_env(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = work / "runs" / "kill" / "logs"
    while proc.poll() is None and not ((log / "rank0.log").exists() and "step 10 " in (log / "rank0.log").read_text()):
        time.sleep(0.1)
    header = (log / "rank1.log").read_text().split("(pid ", 1)[1]
    os.kill(int(header.split(")", 1)[0]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=BOUND_S)
    summary = json.loads((work / "runs" / "kill" / "summary.json").read_text())
    return {
        "hung": False,
        "exit_code": proc.returncode,
        "restarts": summary["restarts"],
        **harness.finished(proc.returncode, out),
    }


def _stopped_and_resumed(work: Path) -> dict:
    """SIGTERM to raydist launch after step 10 (the script snapshots), then the same command: it resumes."""
    argv = harness.launch_argv("fsdp2_dcp", work, 2, "stop", "--output", "all") + ["0.1"]
    proc = subprocess.Popen(argv, cwd=work, env=_env(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = work / "runs" / "stop" / "logs" / "rank0.log"
    while proc.poll() is None and not (log.exists() and "step 10 " in log.read_text()):
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=BOUND_S)
    return _run(harness.launch_argv("fsdp2_dcp", work, 2, "stop"), work, _env(work))


def local_round() -> dict:
    out = {}
    for name in harness.SCRIPTS:
        with tempfile.TemporaryDirectory(prefix="conf-", dir="/tmp") as d:
            work = Path(d)
            base = _run(
                ["torchrun", "--standalone", "--nproc-per-node", "2", *harness.script_argv(name, work)[1:]],
                work,
                _env(work),
            )
            shutil.rmtree(work / "snap", ignore_errors=True)
            got = {"torchrun": base, "launch": _run(harness.launch_argv(name, work, 2, name), work, _env(work))}
            if name == "fsdp2_dcp":
                shutil.rmtree(work / "snap", ignore_errors=True)
                got["launch_rank_killed"] = _killed_mid_run(work)
                shutil.rmtree(work / "snap", ignore_errors=True)
                got["launch_stopped_resumed"] = _stopped_and_resumed(work)
            out[name] = got
    return out


def cluster_rounds(rounds: int) -> list[dict]:
    from tests.support.cluster import rayup
    from tests.support.cluster.emucluster import EmulatedCluster

    out = []
    with EmulatedCluster() as cluster:
        hosts = list(cluster.hosts.values())
        job = rayup.submit(cluster, rayup.write_config(cluster, "conformance"))
        job.wait_for("Ray cluster ready", timeout=180)
        head = [*cluster.nsenter("master-node"), "env", "-C", str(REPO)]
        for i in range(rounds):
            got = {}
            for name in harness.SCRIPTS:
                work = cluster.shared / f"conf{i}-{name}"
                work.mkdir()
                got[name] = {
                    "srun": _run(head + harness.srun_argv(name, work, job.job_id, hosts, 19560), REPO, cluster.env()),
                    "launch": _run(head + harness.launch_argv(name, work, len(hosts), name), REPO, job.env()),
                }
            out.append(got)
            print(f"cluster round {i + 1}: {json.dumps(got)[:400]}", flush=True)
        cluster.run("master-node", ["scancel", str(job.job_id)])
        rayup.wait_no_leftovers(cluster, job.job_id)
        for i in range(rounds):
            for name in harness.SCRIPTS:
                out[i][name]["batch"] = _batch(cluster, rayup, name, i)
    return out


def _batch(cluster, rayup, name: str, i: int) -> dict:
    """sbatch cluster/ray_up.slurm raydist launch ...: the job's output holds the script's line."""
    work = cluster.shared / f"batch{i}-{name}"
    work.mkdir()
    cluster.wait_idle(60)
    command = tuple(harness.launch_argv(name, work, len(cluster.hosts), name, "--output", "rank0"))
    job = rayup.submit(cluster, rayup.write_config(cluster, f"b{i}{name[:4]}"), command=command)
    state = cluster.wait_job(job.job_id, timeout=BOUND_S)
    try:
        return {"hung": False, "state": state, **harness.finished(0 if state == "COMPLETED" else 1, job.text())}
    except AssertionError:
        return {"hung": state not in ("COMPLETED", "FAILED"), "state": state, "tail": job.text()[-1500:]}


def tally(local: list[dict], cluster: list[dict]) -> dict:
    """Per script and launcher: runs, hangs, and results that differ from the baseline's of the same round."""
    out: dict = {}
    for rows, base in ((local, "torchrun"), (cluster, "srun")):
        for row in rows:
            for name, got in row.items():
                for launcher, r in got.items():
                    c = out.setdefault(name, {}).setdefault(
                        launcher, {"runs": 0, "hung": 0, "differ": 0, "exit_fault": 0}
                    )
                    c["runs"] += 1
                    c["hung"] += r.get("hung", False)
                    c["exit_fault"] += r.get("exit_fault", False)
                    ok = not r.get("hung") and "checksum" in got[base] and "checksum" in r
                    c["differ"] += not (ok and harness.same(r, got[base]))
    return out


def main() -> int:
    p = parser(__doc__.splitlines()[0], rounds=2)
    p.add_argument("--no-cluster", action="store_true")
    p.add_argument("--out", default=str(REPO / "docs" / "data" / "conformance.json"))
    a = p.parse_args()
    stamped = stamp()  # the tree the rounds run from: taken before them, as an edit meanwhile would not count
    local = []
    for i in range(a.rounds):
        local.append(local_round())
        print(f"local round {i + 1}: {json.dumps(local[-1])[:400]}", flush=True)
    cluster = [] if a.no_cluster else cluster_rounds(a.rounds)
    stored = {
        "setting": {"local_workers": 2, "cluster_hosts": 3, "bound_s": BOUND_S, "scripts": list(harness.SCRIPTS)},
        "tally": tally(local, cluster),
        "local": local,
        "cluster": cluster,
        **stamped,
    }
    Path(a.out).write_text(json.dumps(stored, indent=1) + "\n")
    print(json.dumps(stored["tally"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
