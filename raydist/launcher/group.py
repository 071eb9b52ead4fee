"""One start of a launched script's process group: place the agents, number the ranks, start, poll, stop.

`Group` acts; it decides nothing (raydist.launcher.policy does, raydist.launcher.driver loops).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from raydist.errors import RaydistError
from raydist.launcher import environment
from raydist.launcher.settings import LaunchConfig

POLL_TIMEOUT_S = 30.0  # an agent that does not answer a poll this long is taken for lost (its node, most likely)


@dataclass
class Rank:
    """The driver's view of one rank of the current start."""

    rank: int
    agent: Any
    slot: environment.Slot
    pid: int | None = None
    exit_code: int | None = None
    last_line: str = ""
    silent_s: float = 0.0
    state: str = "R"
    status: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    rss_bytes: int = 0
    lost: str = ""  # why its agent is gone, once it is
    ended_s_ago: float = 0.0  # at the latest poll: how long ago its process ended

    @property
    def node(self) -> str:
        return self.slot.place.hostname


def bundles(cfg: LaunchConfig, n: int) -> tuple[list[dict[str, float]], str, int]:
    """Placement-group bundles for n processes, the strategy, and processes per bundle."""
    one = {"CPU": cfg.cpus_per_worker, **({"GPU": 1.0} if cfg.use_gpu else {})}
    if not cfg.procs_per_node:
        return [one] * n, "SPREAD", 1
    k = cfg.procs_per_node
    per_node = {r: v * k for r, v in one.items()}
    nodes = n // k
    return [per_node] * nodes, "STRICT_SPREAD" if nodes > 1 else "STRICT_PACK", k


def capacity(cfg: LaunchConfig, nodes: list[dict[str, Any]]) -> int:
    """Processes the alive nodes can hold (by their total CPUs and GPUs), rounded to whole nodes' worth."""
    total = 0
    for node in nodes:
        if not node.get("Alive"):
            continue
        res = node.get("Resources", {})
        fit = int(res.get("CPU", 0) // cfg.cpus_per_worker + 1e-9)
        if cfg.use_gpu:
            fit = min(fit, int(res.get("GPU", 0)))
        total += (fit // cfg.procs_per_node) * cfg.procs_per_node if cfg.procs_per_node else fit
    return total


def group_size(cfg: LaunchConfig, fits: int) -> int:
    """How many processes this start gets: the fixed count, or as many of MIN-MAX as fit (MIN when fewer do:
    placing then waits for nodes, and fails after start_timeout_s)."""
    if not cfg.elastic:
        return cfg.max_workers
    return max(cfg.min_workers, min(cfg.max_workers, fits))


class Group:
    """The agents and processes of one start."""

    def __init__(self, cfg: LaunchConfig, view, n: int, restarts: int, loopback: bool = False):
        self.cfg, self.view, self.n, self.restarts = cfg, view, n, restarts
        self.loopback = loopback  # the embedded instance: one machine, the ranks meet on 127.0.0.1
        self.pg = None
        self.ranks: list[Rank] = []

    def place(self) -> None:
        """Reserve the group's resources at once (all or none), then start one agent per process in them."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from raydist.launcher.agent import RankAgent

        specs, strategy, per_bundle = bundles(self.cfg, self.n)
        self.pg = placement_group(specs, strategy=strategy)
        try:
            ray.get(self.pg.ready(), timeout=self.cfg.start_timeout_s)
        except ray.exceptions.GetTimeoutError:
            why = self._unplaceable()
            remove_placement_group(self.pg)
            self.pg = None
            raise RaydistError(why) from None
        actor = ray.remote(RankAgent)
        agents = [actor.options(
            num_cpus=self.cfg.cpus_per_worker, num_gpus=1 if self.cfg.use_gpu else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i // per_bundle),
            **self.view.options("rank", i)).remote(self.cfg.name, i, self.view.desc.strategy) for i in range(self.n)]
        where = ray.get([a.where.remote() for a in agents], timeout=self.cfg.start_timeout_s)
        # The address Ray's node uses (its interface, chosen at bring-up), not whatever the hostname resolves to.
        ips = {n["NodeID"]: "127.0.0.1" if self.loopback else n["NodeManagerAddress"] for n in ray.nodes()}
        places = [environment.Place(w["node_id"], w["hostname"], ips.get(w["node_id"], w["ip"]), tuple(w["gpu_ids"]),
                                    w["iface"]) for w in where]
        slots = environment.assign_ranks(places)
        self.ranks = sorted((Rank(s.rank, a, s) for a, s in zip(agents, slots)), key=lambda r: r.rank)

    def _unplaceable(self) -> str:
        import ray

        from raydist.cluster_watch import dead_nodes

        dead = [name.split(":", 1)[0] for name in dead_nodes()]
        have = ray.cluster_resources()
        died = f"; dead node(s): {', '.join(dead)}" if dead else ""
        return (f"could not place {self.n} processes (workers={self.cfg.workers} x cpus_per_worker="
                f"{self.cfg.cpus_per_worker:g}{', one GPU each' if self.cfg.use_gpu else ''}) within start_timeout_s="
                f"{self.cfg.start_timeout_s:g} s; the cluster has {have.get('CPU', 0):g} CPUs, "
                f"{have.get('GPU', 0):g} GPUs{died}")

    def start(self, command: list[str], cwd: str, run_id: str) -> None:
        """Every rank's process, with the launcher's environment (raydist.launcher.environment)."""
        import ray

        rank0 = self.ranks[0]
        port = ray.get(rank0.agent.free_port.remote(), timeout=POLL_TIMEOUT_S)
        shared = environment.Group(
            slots=tuple(r.slot for r in self.ranks), master_addr=rank0.slot.place.ip, master_port=port,
            run_id=run_id, restart_count=self.restarts, max_restarts=self.cfg.max_restarts,
            job_name=self.cfg.name, cpus_per_task=self.cfg.cpus_per_worker)
        pids = ray.get([r.agent.start.remote(command, environment.rank_environment(r.slot, shared), cwd, r.rank,
                                             self.restarts) for r in self.ranks], timeout=POLL_TIMEOUT_S)
        for r, pid in zip(self.ranks, pids):
            r.pid = pid

    def poll(self) -> list[tuple[Rank, list[str]]]:
        """Every live rank's news; a rank whose agent died or stopped answering gets `lost` set."""
        import ray

        live = [r for r in self.ranks if not r.lost]
        refs = [r.agent.poll.remote() for r in live]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_TIMEOUT_S)
        done = set(ready)
        out = []
        for r, ref in zip(live, refs):
            if ref not in done:
                r.lost = f"its agent did not answer for {POLL_TIMEOUT_S:.0f} s"
                continue
            try:
                p = ray.get(ref)
            except ray.exceptions.RayError as e:
                r.lost = _death_reason(e)
                continue
            r.exit_code, r.silent_s, r.state = p["exit_code"], p["silent_s"], p["state"]
            r.ended_s_ago = p["ended_s_ago"] or 0.0
            r.status, r.cpu_s, r.rss_bytes = p["status"] or r.status, p["cpu_s"] or r.cpu_s, p["rss_bytes"]
            if p["lines"]:
                r.last_line = next((ln for ln in reversed(p["lines"]) if ln.strip()), r.last_line)
            out.append((r, p["lines"]))
        return out

    def send(self, signame: str) -> None:
        import ray

        refs = [r.agent.send.remote(signame) for r in self.ranks if not r.lost and r.exit_code is None]
        ray.wait(refs, num_returns=len(refs), timeout=POLL_TIMEOUT_S)

    def dump_stacks(self) -> dict[int, dict[str, Any]]:
        """Every live rank's stack, dumped on its own node at the same time."""
        import ray

        live = [r for r in self.ranks if not r.lost and r.exit_code is None]
        refs = [r.agent.dump_stack.remote() for r in live]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=POLL_TIMEOUT_S + 10)
        out = {}
        for r, ref in zip(live, refs):
            try:
                out[r.rank] = ray.get(ref) if ref in ready else {"how": "none", "text": "(no answer)"}
            except ray.exceptions.RayError as e:
                out[r.rank] = {"how": "none", "text": f"(agent lost: {_death_reason(e)})"}
        return out

    def end(self) -> None:
        """Kill what still runs, then the agents and the reservation."""
        import ray
        from ray.util.placement_group import remove_placement_group

        refs = [r.agent.kill.remote() for r in self.ranks if not r.lost]
        ray.wait(refs, num_returns=len(refs), timeout=15)
        for r in self.ranks:
            ray.kill(r.agent, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)
        # Ray frees an actor's resources a moment after ray.kill; the next start waits for them in place().
        time.sleep(0.1)


def _death_reason(e: BaseException) -> str:
    text = str(e)
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        return "its node died"
    return "its Ray worker died"
