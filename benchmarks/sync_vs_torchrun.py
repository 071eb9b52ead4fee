"""Steps/s of jobs/sync.py (Ray Train) against the same loop under plain torchrun, interleaved, as ratios.

    .venv/bin/python benchmarks/sync_vs_torchrun.py --rounds 3 --workers 2

Both run the shared loop (raydist.train.Trainer with SyncDDP) with gloo on CPU; only the launcher differs. `loop` is the
steps/s the training loop measures itself (set-up excluded); `first step` is the time from launching the command
to rank 0's first step done (the loop's `startup` record in metrics.jsonl); `wall` is the whole command, start to
exit. Ray's summary also splits its start-up (`startup_s`: connected, workers' function entered, ready, first step).

A realistic step time (the issue's >= 50 ms/step) on these CPUs:

    .venv/bin/python benchmarks/sync_vs_torchrun.py --rounds 3 --set data.name=synthetic --set model.name=mlp \
        --set model.params=3000000 --set data.synthetic_features=256 --set train.epochs=2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from raydist.observability.metrics import startup_records  # noqa: E402


def run(cmd: list[str], run_dir: Path) -> dict:
    launched = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    result = json.loads(lines[-1])
    result["first_step_s"] = startup_records(str(run_dir / "metrics.jsonl"))[0]["first_step"] - launched
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    args = ap.parse_args()
    py = sys.executable
    rows = []
    with tempfile.TemporaryDirectory(prefix="rd-bench-") as tmp:
        for i in range(args.rounds):
            common = ["--set", f"scaling.num_workers={args.workers}", "--set", f"run.storage_path={tmp}"]
            for o in args.overrides:
                common += ["--set", o]
            runs = {"ray": [py, "jobs/sync.py", *common, "--set", f"run.name=ray{i}"],
                    "torchrun": [py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}",
                                 "benchmarks/torchrun_sync.py", *common, "--set", f"run.name=torchrun{i}"]}
            # Alternate which goes first, so a drift in the machine's load does not favour one side.
            order = ("ray", "torchrun") if i % 2 == 0 else ("torchrun", "ray")
            got = {k: run(runs[k], Path(tmp) / f"{k}{i}") for k in order}
            ray, tr = got["ray"], got["torchrun"]
            rows.append({"round": i, "ray_loop_steps_per_s": ray["steps_per_s"], "torchrun_loop_steps_per_s": tr["steps_per_s"],
                         "ray_first_step_s": ray["first_step_s"], "torchrun_first_step_s": tr["first_step_s"],
                         "ray_startup_s": ray.get("startup_s"),
                         "ray_wall_s": ray["wall_s"], "torchrun_wall_s": tr["wall_s"], "steps": ray["steps"]})
            print(json.dumps(rows[-1]), flush=True)
    loop = statistics.median(r["ray_loop_steps_per_s"] / r["torchrun_loop_steps_per_s"] for r in rows)
    wall = statistics.median(r["ray_wall_s"] / r["torchrun_wall_s"] for r in rows)
    first = statistics.median(r["ray_first_step_s"] / r["torchrun_first_step_s"] for r in rows)
    steps = [r["ray_loop_steps_per_s"] for r in rows]
    print(json.dumps({"workers": args.workers, "rounds": args.rounds,
                      "ray_ms_per_step": round(1e3 / statistics.median(steps), 1),
                      "loop_steps_per_s_ratio_ray_over_torchrun": round(loop, 3),
                      "loop_ratio_per_round": [round(r["ray_loop_steps_per_s"] / r["torchrun_loop_steps_per_s"], 3)
                                               for r in rows],
                      "first_step_ratio_ray_over_torchrun": round(first, 3),
                      "first_step_s": {"ray": round(statistics.median(r["ray_first_step_s"] for r in rows), 2),
                                       "torchrun": round(statistics.median(r["torchrun_first_step_s"] for r in rows), 2)},
                      "wall_ratio_ray_over_torchrun": round(wall, 3)}))


if __name__ == "__main__":
    main()
