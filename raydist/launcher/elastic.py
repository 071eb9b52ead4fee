"""An elastic run (`--workers MIN-MAX`) below its MAX: whether more processes fit the cluster again, a GROW event
(as Ray Train's resize check)."""

from __future__ import annotations

import time

from raydist.launcher import policy
from raydist.launcher.group import capacity, group_size
from raydist.launcher.settings import LaunchConfig

GROW_CHECK_S = 30.0  # how often an elastic run below MAX looks for room for more


class GrowChecks:
    """One start's look for room, every GROW_CHECK_S from its start; never for a fixed-size run."""

    def __init__(self, cfg: LaunchConfig):
        self.cfg = cfg
        self.next_check = time.monotonic() + GROW_CHECK_S

    def event(self, group) -> policy.Event | None:
        if not self.cfg.elastic or time.monotonic() < self.next_check:
            return None
        self.next_check = time.monotonic() + GROW_CHECK_S
        return grown(self.cfg, group)


def grown(cfg: LaunchConfig, group) -> policy.Event | None:
    import ray

    # Room beyond what the group holds now: free CPUs (and GPUs) anywhere, so that other jobs' share counts.
    free = ray.available_resources()
    more = int(free.get("CPU", 0) // cfg.cpus_per_worker + 1e-9)
    if cfg.use_gpu:
        more = min(more, int(free.get("GPU", 0)))
    if cfg.procs_per_node:
        more -= more % cfg.procs_per_node
    fits = group_size(cfg, min(group.n + more, capacity(cfg, ray.nodes())))
    if fits <= group.n:
        return None
    return policy.Event(
        policy.Kind.GROW, detail=f"{fits} of workers={cfg.workers} fit the cluster again (running {group.n})"
    )
