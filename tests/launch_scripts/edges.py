"""A script at the edges srun users meet, one MODE a run (no torch but for `record`):

    raydist launch --workers 2 -- python tests/launch_scripts/edges.py MODE DIR

env: writes what it sees of its environment to DIR/rank<RANK>.json. abort-at-exit: rank 1 returns, then aborts in
atexit (as gloo's teardown race does). hang-at-exit: rank 0 returns, leaving a silent non-daemon thread that never
ends (as a teardown deadlock does). record: rank 1 raises in a function decorated with torch's @record.
"""

import json
import os
import sys
import threading
import time

mode, where = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
if mode == "env":
    seen = {
        k: os.environ.get(k)
        for k in (
            "CLIENT_EPOCHS",
            "FROM_ENV_FLAG",
            "PYTHONPATH",
            "HOSTNAME",
            "TORCHELASTIC_ERROR_FILE",
            "RANK",
            "GLOO_SOCKET_IFNAME",
        )
    }
    seen["host"] = os.uname().nodename
    seen["raydist_variables"] = sorted(k for k in os.environ if k.startswith("RAYDIST_") and k != "RAYDIST_STATUS_FILE")
    seen["sys_path_has_raydist_site"] = any("rank_site" in p for p in sys.path)
    with open(os.path.join(where, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
elif mode == "abort-at-exit" and rank == 1:
    import atexit

    atexit.register(os.abort)
elif mode == "hang-at-exit" and rank == 0:
    threading.Thread(target=time.sleep, args=(3600,), name="never-ends").start()
elif mode == "record":
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if rank == 1:
            raise ValueError("learning rate 7 is out of range")

    main()
print(f"rank {rank}: {mode} done", flush=True)
