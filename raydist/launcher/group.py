"""One start of a launched script's process group: place the agents, number the ranks, start, poll, stop.

`Group` acts; it decides nothing (raydist.launcher.policy does, raydist.launcher.driver loops). Its agents are Ray
actors, one per rank, placed by Ray; or, for the first start on the embedded instance, objects in the driver's own
process (`Here`), which start the ranks while the instance itself is still starting (`Group.here`).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
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
    warm: bool = False  # forked by its node's warm interpreter (raydist.warm.server)
    cold_why: str = ""  # else why not, when the node has one
    exit_code: int | None = None
    last_line: str = ""
    silent_s: float = 0.0
    state: str = "R"
    status: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    rss_bytes: int = 0
    lost: str = ""  # why its agent is gone, once it is
    ended_s_ago: float = 0.0  # at the latest poll: how long ago its process ended
    returned_s_ago: float | None = None  # how long ago its script returned (None: not yet, or not known)
    error: dict[str, str] | None = None  # what it wrote to TORCHELASTIC_ERROR_FILE when it failed
    exit_fault: str = ""  # the line saying how it failed after its script had returned, once it has

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


class Answered:
    """What an agent in the driver's process answered: stands where a Ray call's reference would."""

    def __init__(self, call, args, kwargs):
        self.value, self.error = None, None
        try:
            self.value = call(*args, **kwargs)
        except Exception as e:  # raised again where the answer is read, as ray.get would
            self.error = e

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class Here:
    """A `RankAgent` in the driver's own process, called as its Ray actor would be (`agent.poll.remote()`)."""

    def __init__(self, agent):
        self.agent = agent

    def __getattr__(self, name: str) -> SimpleNamespace:
        method = getattr(self.agent, name)
        return SimpleNamespace(remote=lambda *args, **kwargs: Answered(method, args, kwargs))


def _get(refs: list, timeout: float) -> list:
    if all(isinstance(r, Answered) for r in refs):
        return [r.get() for r in refs]
    import ray

    return ray.get(refs, timeout=timeout)


def _wait(refs: list, timeout: float) -> set:
    """The references that are ready within `timeout`."""
    if all(isinstance(r, Answered) for r in refs):
        return set(range(len(refs)))
    import ray

    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    done = set(ready)
    return {i for i, r in enumerate(refs) if r in done}


def local_gpu_ids(n: int, visible: str | None) -> list[tuple[int, ...]]:
    """Rank i's GPU on this machine, as Ray's embedded instance would give its i-th actor: the i-th of
    CUDA_VISIBLE_DEVICES (none when that one is a UUID, as the Ray-placed agents read theirs), or GPU i when it is
    not set."""
    if visible is None:
        return [(i,) for i in range(n)]
    entries = [v.strip() for v in visible.split(",")]
    return [(int(entries[i]),) if i < len(entries) and entries[i].isdigit() else () for i in range(n)]


class StandIn:
    """A rank's actor in the dashboard's run list for ranks whose agents live in the driver (`Group.here`)."""


class Group:
    """The agents and processes of one start."""

    def __init__(self, cfg: LaunchConfig, view, n: int, restarts: int, loopback: bool = False):
        self.cfg, self.view, self.n, self.restarts = cfg, view, n, restarts
        self.loopback = loopback  # the embedded instance: one machine, the ranks meet on 127.0.0.1
        self.pg = None
        self.ranks: list[Rank] = []
        self.stand_ins: list[Any] = []

    @classmethod
    def here(cls, cfg: LaunchConfig, label: str) -> Group:
        """The first start on the embedded instance: every rank on this machine, its agent in this process, so that
        the ranks start (and import torch) while Ray does. Its view is set once Ray is up."""
        from raydist.launcher.agent import RankAgent

        group = cls(cfg, None, cfg.max_workers, 0, loopback=True)
        gpus = local_gpu_ids(group.n, os.environ.get("CUDA_VISIBLE_DEVICES")) if cfg.use_gpu else [()] * group.n
        places = [environment.Place("", socket.gethostname(), "127.0.0.1", gpus[i], "") for i in range(group.n)]
        agents = [Here(RankAgent(cfg.name, i, label)) for i in range(group.n)]
        slots = environment.assign_ranks(places)
        group.ranks = sorted((Rank(s.rank, a, s) for a, s in zip(agents, slots)), key=lambda r: r.rank)
        return group

    @property
    def in_driver(self) -> bool:
        return bool(self.ranks) and isinstance(self.ranks[0].agent, Here)

    def actors(self) -> list[Any]:
        """The ranks' Ray actors in rank order, for the dashboard: their agents, or stand-ins made now."""
        if not self.in_driver:
            return [r.agent for r in self.ranks]
        if not self.stand_ins:
            import ray

            from raydist.driver.yielding import idle_runtime_env

            # Idle from its start: the stand-ins start while the ranks train (each a Ray worker importing Ray).
            actor, idle = ray.remote(num_cpus=0)(StandIn), idle_runtime_env()
            self.stand_ins = [
                actor.options(**self.view.options("rank", r.rank), runtime_env=idle).remote() for r in self.ranks
            ]
        return self.stand_ins

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
        agents = [
            actor.options(
                num_cpus=self.cfg.cpus_per_worker,
                num_gpus=1 if self.cfg.use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=i // per_bundle
                ),
                **self.view.options("rank", i),
            ).remote(self.cfg.name, i, self.view.desc.strategy)
            for i in range(self.n)
        ]
        where = ray.get([a.where.remote() for a in agents], timeout=self.cfg.start_timeout_s)
        # The address Ray's node uses (its interface, chosen at bring-up), not whatever the hostname resolves to.
        ips = {n["NodeID"]: "127.0.0.1" if self.loopback else n["NodeManagerAddress"] for n in ray.nodes()}
        places = [
            environment.Place(
                w["node_id"], w["hostname"], ips.get(w["node_id"], w["ip"]), tuple(w["gpu_ids"]), w["iface"]
            )
            for w in where
        ]
        slots = environment.assign_ranks(places)
        self.ranks = sorted((Rank(s.rank, a, s) for a, s in zip(agents, slots)), key=lambda r: r.rank)

    def _unplaceable(self) -> str:
        import ray

        from raydist.cluster.watch import dead_nodes

        dead = [name.split(":", 1)[0] for name in dead_nodes()]
        have = ray.cluster_resources()
        died = f"; dead node(s): {', '.join(dead)}" if dead else ""
        return (
            f"could not place {self.n} processes (workers={self.cfg.workers} x cpus_per_worker="
            f"{self.cfg.cpus_per_worker:g}{', one GPU each' if self.cfg.use_gpu else ''}) within start_timeout_s="
            f"{self.cfg.start_timeout_s:g} s; the cluster has {have.get('CPU', 0):g} CPUs, "
            f"{have.get('GPU', 0):g} GPUs{died}"
        )

    def start(self, command: list[str], cwd: str, run_id: str, env) -> None:
        """Every rank's process, with the launcher's environment (raydist.launcher.environment) and the caller's
        (`env`, an environment.RankEnv)."""
        rank0 = self.ranks[0]
        port = _get([rank0.agent.free_port.remote()], POLL_TIMEOUT_S)[0]
        shared = environment.Group(
            slots=tuple(r.slot for r in self.ranks),
            master_addr=rank0.slot.place.ip,
            master_port=port,
            run_id=run_id,
            restart_count=self.restarts,
            max_restarts=self.cfg.max_restarts,
            job_name=self.cfg.name,
            cpus_per_task=self.cfg.cpus_per_worker,
        )
        extra = {}
        if self.in_driver and "OMP_NUM_THREADS" not in {**os.environ, **env.caller, **env.named}:
            # What a rank of a Ray-placed start inherits from its agent: Ray gives each worker process as many
            # threads as it has CPUs (torchrun sets 1). Without it each rank takes every core's thread.
            extra["OMP_NUM_THREADS"] = str(max(1, int(self.cfg.cpus_per_worker)))
        started = _get(
            [
                r.agent.start.remote(
                    command,
                    {**environment.rank_environment(r.slot, shared), **extra},
                    cwd,
                    r.rank,
                    self.restarts,
                    warm=self.cfg.warm,
                    caller_env=env.caller,
                    named=env.named,
                )
                for r in self.ranks
            ],
            POLL_TIMEOUT_S,
        )
        for r, s in zip(self.ranks, started):
            r.pid, r.warm, r.cold_why = s["pid"], s["warm"], s["cold_why"]

    def poll(self) -> list[tuple[Rank, list[str]]]:
        """Every live rank's news; a rank whose agent died or stopped answering gets `lost` set."""
        import ray

        live = [r for r in self.ranks if not r.lost]
        refs = [r.agent.poll.remote() for r in live]
        done = _wait(refs, POLL_TIMEOUT_S)
        out = []
        for i, (r, ref) in enumerate(zip(live, refs)):
            if i not in done:
                r.lost = f"its agent did not answer for {POLL_TIMEOUT_S:.0f} s"
                continue
            try:
                p = _get([ref], POLL_TIMEOUT_S)[0]
            except ray.exceptions.RayError as e:
                r.lost = _death_reason(e)
                continue
            r.exit_code, r.silent_s, r.state = p["exit_code"], p["silent_s"], p["state"]
            r.ended_s_ago = p["ended_s_ago"] or 0.0
            r.returned_s_ago, r.error = p["returned_s_ago"], p["error"] or r.error
            r.status, r.cpu_s, r.rss_bytes = p["status"] or r.status, p["cpu_s"] or r.cpu_s, p["rss_bytes"]
            if p["lines"]:
                r.last_line = next((ln for ln in reversed(p["lines"]) if ln.strip()), r.last_line)
            out.append((r, p["lines"]))
        return out

    def send(self, signame: str) -> None:
        refs = [r.agent.send.remote(signame) for r in self.ranks if not r.lost and r.exit_code is None]
        _wait(refs, POLL_TIMEOUT_S)

    def dump_stacks(self, ranks: list[Rank] | None = None) -> dict[int, dict[str, Any]]:
        """Every live rank's stack (or these ranks'), dumped on its own node at the same time."""
        import ray

        live = [r for r in (self.ranks if ranks is None else ranks) if not r.lost and r.exit_code is None]
        refs = [r.agent.dump_stack.remote() for r in live]
        ready = _wait(refs, POLL_TIMEOUT_S + 10)
        out = {}
        for i, (r, ref) in enumerate(zip(live, refs)):
            try:
                out[r.rank] = _get([ref], POLL_TIMEOUT_S)[0] if i in ready else {"how": "none", "text": "(no answer)"}
            except ray.exceptions.RayError as e:
                out[r.rank] = {"how": "none", "text": f"(agent lost: {_death_reason(e)})"}
        return out

    def kill(self, rank: Rank) -> None:
        """SIGKILL one rank's process group (its agent stays)."""
        if not rank.lost:
            _wait([rank.agent.kill.remote()], POLL_TIMEOUT_S)

    def end(self) -> None:
        """Kill what still runs, then the agents and the reservation."""
        refs = [r.agent.kill.remote() for r in self.ranks if not r.lost]
        _wait(refs, 15)
        if self.in_driver and not self.stand_ins:
            return  # nothing of Ray's: this start may have ended before Ray was up
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.stand_ins if self.in_driver else [r.agent for r in self.ranks]:
            ray.kill(actor, no_restart=True)
        if self.pg is not None:
            remove_placement_group(self.pg)
        # Ray frees an actor's resources a moment after ray.kill; the next start waits for them in place().
        time.sleep(0.1)


def _death_reason(e: BaseException) -> str:
    text = str(e)
    if "node" in text.lower() and ("died" in text.lower() or "dead" in text.lower()):
        return "its node died"
    return "its Ray worker died"
