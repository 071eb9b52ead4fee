"""The actors of one start of an async PS run and who each of them is, so that the driver can say which one died.

When any actor dies the driver replaces them all (see `AsyncPSRun.run`); this module only keeps the books for
that: each actor's role by its id, and its host, noted while it was alive (a dead actor cannot be asked).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from typing import Any

from raydist.private_api import actor_id

UNKNOWN_NODE = "?"
SETTLE_S = 10  # how long a killed worker's `run` call may take to come back failed

# Ray's one sentence on why an actor died, inside a message that also holds context lines and advice.
_CAUSES = (
    re.compile(r"The actor (?:is dead|died) because (.+?)\.(?=\s|$)"),  # its worker process / its node has died
    re.compile(r"The actor \w+ is (unavailable: .+?)\.(?=\s|$)"),
)


def _hostname(_actor: Any) -> str:
    """Runs inside an actor (through `__ray_call__`): the host it lives on."""
    return socket.gethostname()


def why(error: BaseException) -> str:
    """The short cause of an actor's death ('its worker process has died', 'its node has died')."""
    if getattr(error, "preempted", False):
        return "its node was preempted"
    # A worker's task error that carries a shard's death prints the worker's traceback first; the cause is the
    # shard's own ActorDiedError.
    text = str(getattr(error, "cause", None) or error)
    for cause in _CAUSES:
        found = cause.search(text)
        if found:
            return found.group(1)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else type(error).__name__


@dataclass(frozen=True)
class Death:
    """One actor's death (or hang), as the driver reports it."""

    who: str  # "server shard 1", "worker 0", "staleness gate"
    why: str
    node: str
    verb: str = "died"  # or "stopped answering"

    def __str__(self) -> str:
        return f"{self.who} {self.verb} ({self.why}) on node {self.node}"


class Hung(Exception):
    """An actor of the run has made no progress, or answered nothing, for faults.hang_timeout_s: the driver treats
    it as dead (restart from a checkpoint, or fail)."""

    def __init__(self, death: Death):
        super().__init__(str(death))
        self.death = death


PROBE_S = 1.0  # how often the watchdog asks each server shard for a sign of life
BLAME_SHARD_S = 2.0  # a shard silent this long when workers stall is taken as the cause (a stalled shard stalls them)


class Watchdog:
    """Bounds a stopped or frozen actor (SIGSTOP, a wedged node), which Ray does not report as dead: a worker whose
    steps stop arriving for `bound` seconds, or a server shard that leaves a cheap call unanswered that long.

    Workers are judged by their step records (shard 0's drain), shards by a probe every PROBE_S; a worker that
    waits on a stopped shard stalls too, so when workers stall a silent shard is blamed first."""

    def __init__(self, crew: Crew, bound: float, now: float):
        self.crew, self.bound = crew, bound
        self.last_step = {k: now for k in range(len(crew.workers))}
        self.probes: dict[int, tuple[Any, float]] = {}  # shard index -> (its pending probe, sent at)
        self.probed = now

    def saw(self, records: list[dict[str, Any]], now: float) -> None:
        for r in records:
            self.last_step[r["worker"]] = now

    def finished(self, worker: int) -> None:
        self.last_step.pop(worker, None)

    def check(self, now: float) -> None:
        """Raise Hung naming the actor when one is past the bound."""
        import ray

        if self.probes:
            answered, _ = ray.wait([ref for ref, _ in self.probes.values()], num_returns=len(self.probes), timeout=0)
            self.probes = {i: (ref, sent) for i, (ref, sent) in self.probes.items() if ref not in answered}
        if now - self.probed >= PROBE_S:
            for i, shard in enumerate(self.crew.shards):
                self.probes.setdefault(i, (shard.__ray_ready__.remote(), now))
            self.probed = now
        silent = sorted((sent, i) for i, (_, sent) in self.probes.items())
        if silent and now - silent[0][0] > self.bound:
            raise Hung(self.crew.hung(self.crew.shards[silent[0][1]], now - silent[0][0], self.bound, "no answer"))
        stalled = sorted((seen, k) for k, seen in self.last_step.items() if now - seen > self.bound)
        if stalled:
            if silent and now - silent[0][0] > BLAME_SHARD_S:
                i = silent[0][1]
                raise Hung(self.crew.hung(self.crew.shards[i], now - silent[0][0], self.bound, "no answer"))
            seen, k = stalled[0]
            raise Hung(self.crew.hung(self.crew.workers[k], now - seen, self.bound, "no step"))


@dataclass
class Crew:
    """Server shards, the staleness gate (if any) and workers of one start, each named by its actor id."""

    shards: list = field(default_factory=list)
    workers: list = field(default_factory=list)
    gate: Any = None
    runs: list = field(default_factory=list)  # the workers' `run` calls
    names: dict[str, str] = field(default_factory=dict)  # actor id (hex) -> "server shard 1", "worker 0", ...
    hosts: dict[str, str] = field(default_factory=dict)  # actor id -> the host it runs on

    def add(self, actor: Any, name: str) -> Any:
        """Name an actor as soon as it is created: it may die before it ever answers."""
        self.names[actor_id(actor)] = name
        return actor

    def everyone(self) -> list:
        return [*self.shards, *([self.gate] if self.gate is not None else []), *self.workers]

    def locate(self) -> None:
        """Wait until every actor is up (the workers have loaded their data) and note each one's host."""
        import ray

        actors = self.everyone()
        for actor, host in zip(actors, ray.get([a.__ray_call__.remote(_hostname) for a in actors])):
            self.hosts[actor_id(actor)] = host

    def kill(self) -> None:
        """End every actor of this start (those already dead included: ray.kill is a no-op for them), then take the
        workers' failed `run` results: Ray prints a failure nobody took, with its traceback, as an 'Unhandled error'."""
        import ray

        for actor in self.everyone():
            ray.kill(actor, no_restart=True)
        ended, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=SETTLE_S) if self.runs else ([], [])
        for ref in ended:
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                pass  # the failure that matters has been reported already

    def ask(self, actors: list, calls: list, bound: float) -> list:
        """The answers to one call per actor, waited for at most `bound` seconds (faults.hang_timeout_s) in all:
        an actor that leaves its call unanswered that long is hung. The driver's loop runs the watchdog, so a call
        it waits on without a bound (a checkpoint's, an evaluation's) would let a stopped shard hold the run for
        ever."""
        import ray

        answered, _ = ray.wait(calls, num_returns=len(calls), timeout=bound)
        if len(answered) < len(calls):
            silent = next(actor for actor, call in zip(actors, calls) if call not in answered)
            raise Hung(self.hung(silent, bound, bound, "no answer"))
        return ray.get(calls)

    def hung(self, actor: Any, seconds: float, bound: float, what: str) -> Death:
        key = actor_id(actor)
        return Death(
            self.names.get(key, "an actor of the run"),
            f"{what} for {seconds:.0f} s, faults.hang_timeout_s={bound:g}",
            self.hosts.get(key, UNKNOWN_NODE),
            verb="stopped answering",
        )

    def death(self, error: BaseException) -> Death:
        """Who died, why and where, from the error the driver caught. The error names the dead actor's id: a call
        to a dead actor raises its ActorDiedError, and a worker that failed because a shard died raises a task
        error that carries the shard's ActorDiedError (and its id), so the shard is named, not the worker."""
        dead = getattr(error, "actor_id", None)
        node = self.hosts.get(dead) or _node_named_in(str(getattr(error, "cause", None) or error))
        return Death(self.names.get(dead, "an actor of the run"), why(error), node)


def _node_named_in(message: str) -> str:
    """The host of the node whose address Ray's death message gives (for an actor that died before it answered)."""
    import ray

    found = re.search(r"^\s*ip: (\S+)\s*$", message, re.M)
    if found is None:
        return UNKNOWN_NODE
    hosts = {n["NodeManagerAddress"]: n["NodeManagerHostname"] for n in ray.nodes()}
    return hosts.get(found[1], found[1])
