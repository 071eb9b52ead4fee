"""A rank of a loop strategy under scaling.engine=launch: `raydist launch`'s agents start one per worker.

    python -m raydist.engines.process_worker <run dir>/.launch-<fit id>.json

The file (written by raydist.engines.processes) holds the run's config, the strategy's registry name and the fit id;
the rank's torch.distributed settings come from the environment the launcher gives every rank (RANK, WORLD_SIZE,
MASTER_ADDR, ...), as under torchrun.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    entered = time.time()
    import torch.distributed as dist

    from raydist import registry
    from raydist.atomic import write_json_atomic
    from raydist.config import Config
    from raydist.engines.raytrain_worker import FAILURE_FILE
    from raydist.train.context import LaunchedContext
    from raydist.train.loop import Trainer

    job = json.loads(Path(argv[0]).read_text())
    cfg = Config.from_dict(job["config"])
    strategy = registry.get(job["strategy"]).load("worker")
    ctx = LaunchedContext(cfg, job["fit_id"], job.get("stop_signal", "SIGTERM"))
    trainer = Trainer(cfg, ctx, strategy, entered)
    trainer.fit()
    if trainer.aborted and ctx.rank == 0:  # the driver's summary says the run failed, and why
        write_json_atomic(Path(cfg.run.run_dir) / FAILURE_FILE, {"reason": trainer.aborted})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from raydist.errors import exits_cleanly

    sys.exit(exits_cleanly(main)(sys.argv[1:]))
