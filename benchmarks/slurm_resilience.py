"""Measure the time-limit warning and a lost node on the emulated SLURM cluster, as docs/benchmarks.md and
docs/slurm.md quote them: warning -> stop checkpoint on disk and steps lost over the requeue (sync DDP, async PS),
and a fixed-size run's exit after a node's Ray is killed mid-run.

    flock /tmp/raydist-emu.lock .venv/bin/python -m benchmarks.slurm_resilience --rounds 3 \\
        --out docs/data/slurm_resilience.json
    .venv/bin/python -m benchmarks.slurm_resilience --report docs/data/slurm_resilience.json  # the docs' table

(root.) The scenarios are tests/support/cluster/resilience.py's, which tests/test_slurm_resilience.py runs once each.
Builds and removes its own emulated cluster.
"""

from __future__ import annotations

import json

from benchmarks import stored as stored_file
from tests.support.cluster.emucluster import EmulatedCluster
from tests.support.cluster.resilience import lose_a_node_mid_run, warn_and_resume

NODE_LOSS_TIMEOUT_S = 15.0
JOBS = {
    "sync": [
        "python",
        "jobs/sync.py",
        "--set",
        "scaling.num_workers=2",
        "--set",
        "train.epochs=25",
        "--set",
        "straggler.worker=0",
        "--set",
        "straggler.slowdown=4",
    ],
    "async": [
        "python",
        "jobs/async.py",
        "--set",
        "scaling.num_workers=2",
        "--set",
        "async_ps.num_servers=2",
        "--set",
        "train.epochs=60",
        "--set",
        "straggler.worker=0",
        "--set",
        "straggler.slowdown=4",
    ],
}


def warned_round(cluster: EmulatedCluster, strategy: str, name: str) -> dict:
    storage = cluster.shared / "runs"
    command = [*JOBS[strategy], "--set", f"run.storage_path={storage}", "--set", f"run.name={name}"]
    warned = warn_and_resume(cluster, name, command, storage / name)
    summary = json.loads((storage / name / "summary.json").read_text())
    return {
        "warning_to_checkpoint_s": round(warned.warning_to_checkpoint_s, 3),
        "stopped_at": warned.stopped_at,
        "held_back_s": round(warned.held_back_s, 1),
        "resumed_from_step": summary["resumed_from_step"],
        "status": summary["status"],
        "steps": summary["steps"],
        "total_steps": summary["total_steps"],
    }


def lost_round(cluster: EmulatedCluster, name: str) -> dict:
    lost = lose_a_node_mid_run(cluster, name, NODE_LOSS_TIMEOUT_S)
    errors = sorted({ln for ln in lost.output.splitlines() if ln.startswith("raydist: error:")})
    return {
        "kill_to_exit_s": round(lost.kill_to_exit_s, 2),
        "returncode": lost.returncode,
        "error": errors[-1] if errors else "",
    }


def measure(rounds: int) -> dict:
    runs: dict[str, list[dict]] = {"sync": [], "async": [], "node_loss": []}
    with EmulatedCluster() as cluster:
        for i in range(rounds):
            for strategy in ("sync", "async"):
                runs[strategy].append(warned_round(cluster, strategy, f"warn-{strategy}{i}"))
                print(f"round {i + 1} {strategy}: {runs[strategy][-1]}", flush=True)
            runs["node_loss"].append(lost_round(cluster, f"lost{i}"))
            print(f"round {i + 1} node loss: {runs['node_loss'][-1]}", flush=True)
    return {"rounds": rounds, "node_loss_timeout_s": NODE_LOSS_TIMEOUT_S, "jobs": JOBS, **runs}


def _values(values: list[float], unit: str = "s", digits: int = 2) -> str:
    return f"{stored_file.spread(values, digits)} {unit}; each: {', '.join(f'{v:.{digits}f}' for v in values)}"


def report(stored: dict) -> str:
    """The table docs/benchmarks.md and docs/slurm.md quote."""
    lost = [r["resumed_from_step"] - r["stopped_at"] for s in ("sync", "async") for r in stored[s]]
    named = all(r["returncode"] == 1 and "node(s) died: node02" in r["error"] for r in stored["node_loss"])
    return (
        "| what | measured (median (min-max); each round) |\n|---|---|\n"
        f"| time-limit warning to the stop checkpoint's manifest on disk, sync DDP (2 workers) "
        f"| {_values([r['warning_to_checkpoint_s'] for r in stored['sync']])} |\n"
        f"| the same, async PS (2 workers, 2 server shards) "
        f"| {_values([r['warning_to_checkpoint_s'] for r in stored['async']])} |\n"
        f"| steps lost per warning (the step the requeued run resumed from, less the step the warning stopped at) "
        f"| {', '.join(str(v) for v in lost)} |\n"
        f"| SLURM's hold on a requeued job before it may start again (its BeginTime; the tests cut it short) "
        f"| {_values([r['held_back_s'] for s in ('sync', 'async') for r in stored[s]], digits=0)} |\n"
        f"| fixed 3-worker run, node02's Ray SIGKILLed mid-run, `node_loss_timeout_s="
        f"{stored['node_loss_timeout_s']:g}`: kill to exit 1 "
        f"| {_values([r['kill_to_exit_s'] for r in stored['node_loss']], digits=1)}"
        f"{'; each named node02' if named else '; NOT each named node02'} |\n"
    )


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=3)
    stored_file.cli(ap, "docs/data/slurm_resilience.json", report, lambda args: measure(args.rounds))


if __name__ == "__main__":
    main()
