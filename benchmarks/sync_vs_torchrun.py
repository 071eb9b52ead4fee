"""Steps/s of jobs/sync.py (Ray Train) against the same loop under plain torchrun, interleaved, as ratios.

    .venv/bin/python benchmarks/sync_vs_torchrun.py --rounds 3 --workers 2

Both run the shared loop (raydist.train.Trainer with SyncDDP) with gloo on CPU; only the launcher differs. `loop` is the
steps/s the training loop measures itself (set-up excluded); `wall` is the whole command, start to exit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


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
            ray = run([py, "jobs/sync.py", *common, "--set", f"run.name=ray{i}"])
            tr = run([py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.workers}",
                      "benchmarks/torchrun_sync.py", *common, "--set", f"run.name=torchrun{i}"])
            rows.append({"round": i, "ray_loop_steps_per_s": ray["steps_per_s"], "torchrun_loop_steps_per_s": tr["steps_per_s"],
                         "ray_wall_s": ray["wall_s"], "torchrun_wall_s": tr["wall_s"], "steps": ray["steps"]})
            print(json.dumps(rows[-1]), flush=True)
    loop = statistics.median(r["ray_loop_steps_per_s"] / r["torchrun_loop_steps_per_s"] for r in rows)
    wall = statistics.median(r["ray_wall_s"] / r["torchrun_wall_s"] for r in rows)
    print(json.dumps({"workers": args.workers, "rounds": args.rounds,
                      "loop_steps_per_s_ratio_ray_over_torchrun": round(loop, 3),
                      "wall_ratio_ray_over_torchrun": round(wall, 3)}))


if __name__ == "__main__":
    main()
