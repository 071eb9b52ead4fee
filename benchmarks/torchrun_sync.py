"""The same sync DDP loop as jobs/sync.py, under plain torchrun with gloo: the baseline for Ray's overhead.

torchrun --standalone --nproc-per-node 2 benchmarks/torchrun_sync.py --set run.storage_path=/tmp/bench

--in-thread runs the loop in a second thread of the process, as Ray Train runs `train_loop_per_worker`
(benchmarks/footprint_ab.py).
"""

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raydist.errors import exits_cleanly  # noqa: E402
from raydist.job import parse_job_args  # noqa: E402
from raydist.strategies.sync.worker import SyncDDP  # noqa: E402
from raydist.train import Trainer  # noqa: E402
from raydist.train.context import TorchrunContext  # noqa: E402


@exits_cleanly
def main() -> int:
    start = time.perf_counter()
    cfg = parse_job_args("sync", None, __doc__)
    ctx = TorchrunContext(cfg.run.run_dir)
    last = Trainer(cfg, ctx, SyncDDP).fit()
    if ctx.rank == 0:
        print(
            json.dumps(
                {
                    "strategy": "torchrun-sync",
                    "steps": last.get("step"),
                    "wall_s": time.perf_counter() - start,
                    "test_accuracy": last.get("test_accuracy"),
                    "steps_per_s": last.get("steps_per_s"),
                    "samples_per_s": last.get("samples_per_s"),
                    "checkpoint": ctx.last_checkpoint,
                }
            ),
            flush=True,
        )
    return 0


def in_thread() -> int:
    codes = []
    thread = threading.Thread(target=lambda: codes.append(main()), name="train")
    thread.start()
    thread.join()
    return codes[0] if codes else 1


if __name__ == "__main__":
    if "--in-thread" in sys.argv:
        sys.argv.remove("--in-thread")
        sys.exit(in_thread())
    sys.exit(main())
