"""One start of an async PS run's actors, trained to the end of the session's budget: the driver's loop, which
polls shard 0 for the workers' update records and does what the schedule (raydist.train.schedule) says is due."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from raydist.config import Config
from raydist.private_api import actor_id
from raydist.strategies.async_ps import checkpoints
from raydist.strategies.async_ps.budget import Budget
from raydist.strategies.async_ps.crew import UNKNOWN_NODE, Crew, Watchdog
from raydist.strategies.async_ps.evaluator import Evaluator
from raydist.strategies.async_ps.messages import Drained, WorkerReport
from raydist.strategies.async_ps.progress import Progress
from raydist.train.schedule import Cadence, Due, Every, Schedule

POLL_S = 0.1  # how often the driver collects update records and asks its schedule what is due


@dataclass
class Grants:
    """How far shard 0 may hand out steps, and why it stops short of the session's budget. Both outlive a restart:
    the new shards get the lowered limit, so the run still stops at the step it was asked to."""

    limit: int
    stop_reason: str | None = None


@dataclass(frozen=True)
class Ending:
    """What a start that trained to the end leaves for the summary."""

    reports: list[WorkerReport]
    stats: list[dict[str, Any]]  # each shard's books (`ParameterShard.stats`)
    checkpoint: str | None
    server_hosts: list[str]


class TrainingLoop:
    """Trains one start of the crew: `watch` until the workers end, then `finish`. A worker that fails, dies or
    hangs, or a shard that leaves a call unanswered, ends it with Ray's error or crew.Hung, for the driver's policy."""

    def __init__(
        self, cfg: Config, crew: Crew, progress: Progress, grants: Grants, budget: Budget, evaluator: Evaluator
    ):
        self.cfg, self.crew, self.progress, self.grants = cfg, crew, progress, grants
        self.budget, self.evaluator = budget, evaluator
        # Checkpoints count from the last one: the steps done jump by what the workers did between two polls.
        self.cadence = Cadence(
            report_every_s=cfg.train.report_every_s, checkpoint=Every(budget.checkpoint_every, since_last=True)
        )
        self.schedule: Schedule | None = None  # both from when the workers start (`watch`)
        self.watchdog: Watchdog | None = None

    def watch(self, done: dict[int, int]) -> list[WorkerReport]:
        """Start the workers at their data positions `done`, then until they finish: log their steps and act on
        what the schedule says is due (`_act`); a worker that fails, dies or hangs ends the attempt here."""
        import ray

        p = self.progress
        if p.t0 is None:
            p.t0 = time.time()
        runs = self.crew.runs = [w.run.remote(done.get(k, 0), p.t0) for k, w in enumerate(self.crew.workers)]
        p.bar.new_session(p.steps)
        self.schedule = Schedule.starting(self.cadence, p.steps, time.perf_counter(), self._epochs())
        pending = list(runs)
        self.watchdog = Watchdog(self.crew, self.cfg.faults.hang_timeout_s, time.monotonic())
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            ray.get(ready)  # a failed worker fails the run now, not when the others are done
            for ref in ready:
                self.watchdog.finished(runs.index(ref))
            self._collect()
            if not pending:
                break
            self.watchdog.check(time.monotonic())
            self._act(self.schedule.due(p.steps, time.perf_counter(), epochs=self._epochs()))
        p.train_time_s = time.time() - p.t0
        return ray.get(runs)

    def finish(self, reports: list[WorkerReport]) -> Ending:
        """The session's last step: its records, a final evaluation and checkpoint, then the shards' books."""
        self._collect()
        self._evaluate()
        self.progress.show()
        # Every worker ended with a fetch, which came after its pushes to each shard: the shards agree.
        checkpoint = self._checkpoint()
        hosts = [self.crew.hosts.get(actor_id(s), UNKNOWN_NODE) for s in self.crew.shards]
        return Ending(reports, self._ask_shards("stats"), checkpoint, hosts)

    def _epochs(self) -> int:
        """Epochs' worth of steps done: evaluations follow them, as sync's follow its epoch ends."""
        return self.progress.steps // self.budget.per_epoch

    def _act(self, due: Due) -> None:
        """At one poll: evaluate, show progress, report, checkpoint and ask whether to stop, as due."""
        if due.evaluate:
            self._evaluate()
            self.schedule.evaluated(self._epochs())
        self.progress.show()
        if due.report:
            self.progress.report()
            self.schedule.reported(time.perf_counter())
        if due.checkpoint:
            self._checkpoint()
        if due.stop_poll and self.grants.stop_reason is None:
            self.schedule.polled(time.perf_counter())
            self._check_stop()

    def _check_stop(self) -> None:
        """On a stop request or a draining node: grant no more steps; the workers end after the steps they hold,
        and the final checkpoint then covers every step taken (none lost beyond those in flight)."""
        from raydist.cluster.preemption import draining_nodes, stop_requested
        from raydist.cluster.watch import preempted

        request = stop_requested()
        draining = draining_nodes()
        if request is None and not draining:
            return
        self.grants.stop_reason = request.describe() if request is not None else preempted(draining)
        self.grants.limit = self._ask_shards("stop_granting", shards=self.crew.shards[:1])[0]
        print(f"[raydist] async: stopping after step {self.grants.limit}: {self.grants.stop_reason}", flush=True)

    def _collect(self) -> None:
        drained: Drained = self._ask_shards("drain", shards=self.crew.shards[:1])[0]
        if self.watchdog is not None:
            self.watchdog.saw(drained.records, time.monotonic())
        self.progress.take(drained)

    def _ask_shards(self, method: str, shards: list | None = None) -> list:
        """Each shard's answer to `method`, bounded by faults.hang_timeout_s (`Crew.ask`): the loop's calls to the
        shards (records, evaluations, checkpoints, the stop) raise Hung naming a shard that answers none."""
        shards = self.crew.shards if shards is None else shards
        return self.crew.ask(shards, [getattr(s, method).remote() for s in shards], self.cfg.faults.hang_timeout_s)

    def _evaluate(self) -> None:
        self.progress.scored(self.evaluator(self._ask_shards("pull")))

    def _checkpoint(self) -> str | None:
        """Save every shard's state if they agree on each worker's steps; None (the next poll tries again) if not.

        The shards answer one after another while workers push, so a gradient can be in one shard's state and not
        yet in another's: restoring that would apply it twice or on some shards only. Agreement on each worker's
        count means the same gradients everywhere (a worker's pushes reach each shard in order)."""
        states = self._ask_shards("state_dict")
        if any(st["done"] != states[0]["done"] for st in states[1:]):
            return None
        # The records of steps in this state that are still in shard 0's buffer (it runs this drain after
        # state_dict) go into metrics.jsonl before the checkpoint exists: a restart from it never recomputes them.
        self._collect()
        at = sum(states[0]["done"].values())  # shard 0's count of each worker's steps: where data resumes
        state = {"shards": states, "workers": self.cfg.scaling.max_workers, "steps": at, "config": self.cfg.to_dict()}
        self.progress.log.flush()  # TensorBoard's points up to here, on disk before a checkpoint a restart starts after
        path = checkpoints.save(self.cfg.run.run_dir, at, state, self.cfg.checkpoint.keep)
        self.schedule.checkpointed(at)
        return path
