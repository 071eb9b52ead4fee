"""What the desync check costs: steps/s of the sync DDP loop with faults.desync_every_steps = 0 (off), 100 and 1,
interleaved round by round, as ratios to "off".

    .venv/bin/python benchmarks/desync_cost.py --rounds 5 [--set model.hidden=1024 ...]

Runs the shared loop under plain torchrun (benchmarks/torchrun_sync.py, 2 workers, gloo): no Ray start-up in the
numbers. "every 100" pays the DDP communication hook on every step and the fingerprint (a gradient norm, a
parameter checksum, two more floats in the step's all-reduce) once per 100; "every 1" pays the fingerprint on every
step, an upper bound.
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
SETTINGS = {"off": 0, "every 100": 100, "every 1": 1}


def once(every: int, storage: str, overrides: list[str]) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(REPO / "benchmarks" / "torchrun_sync.py"), "--set", f"run.storage_path={storage}",
           "--set", f"run.name=every{every}", "--set", f"faults.desync_every_steps={every}",
           "--set", "checkpoint.every_steps=100000", "--set", "train.report_every_s=1000"]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"benchmark run failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])["steps_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--set", action="append", default=["train.epochs=10"], dest="overrides", metavar="KEY=VALUE")
    args = ap.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="rd-desync-cost-") as storage:
        for _ in range(args.rounds):
            for name, every in SETTINGS.items():
                rates[name].append(once(every, storage, args.overrides))
    base = statistics.median(rates["off"])
    print(f"sync DDP, 2 workers, {' '.join(args.overrides)}: off {base:.1f} steps/s (median of {args.rounds})")
    for name in list(SETTINGS)[1:]:
        ratios = [r / o for r, o in zip(rates[name], rates["off"])]
        print(f"  {name}: {statistics.median(ratios):.3f}x of off (per-round ratios "
              f"{', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
