"""jobs/async.py's driver: places the server shards and workers, watches them, evaluates, checkpoints and resumes."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from raydist import registry
from raydist.torchkit import sharding
from raydist.torchkit.checkpoint import checkpoint_dirs, newest_valid, publish_dir, skipped_line, verify, write_atomic, write_manifest
from raydist.torchkit.commstats import per_worker_summary
from raydist.config import Config
from raydist.observability.console import ProgressBar, start_line
from raydist.torchkit.data import load_splits
from raydist.errors import RaydistError, UsageError
from raydist.train.evaluation import evaluate
from raydist.torchkit.flat import as_tensor, flatten_, slice_bounds
from raydist.torchkit.models import build_model
from raydist.observability.ray_metrics import Exporter
from raydist.train.schedule import Cadence, Due, Every, Schedule
from raydist.strategies.async_ps import policy
from raydist.strategies.async_ps.crew import Crew, Hung, Watchdog
from raydist.driver.train_view import RunDescription, TrainView, actor_name
from raydist.strategies.async_ps.checks import check_async
from raydist.strategies.async_ps.messages import Drained, PullReply, WorkerReport
from raydist.summary import JobSummary
from raydist.observability.tensorboard_log import RunLog
from raydist.private_api import actor_id

STRATEGY = "async"
STATE_FILE = "ps_state.pt"
PLACEMENT_TIMEOUT_S = 120
POLL_S = 0.1  # how often the driver collects update records and asks its schedule what is due


def latest_checkpoint(run_dir: str) -> str | None:
    """The newest checkpoint of the run that verifies; one line names each newer, broken one it passed over."""
    found, skipped = newest_valid(run_dir, STATE_FILE)
    if skipped:
        print(skipped_line(skipped, found), flush=True)
    return found


def load_params(checkpoint_dir: str) -> torch.Tensor:
    """The flat parameter vector a checkpoint holds (the shards' slices, joined)."""
    why = verify(checkpoint_dir, required=STATE_FILE)
    if why is not None:
        raise RaydistError(f"checkpoint {checkpoint_dir} is broken: {why}")
    state = torch.load(os.path.join(checkpoint_dir, STATE_FILE), map_location="cpu", weights_only=False)
    return torch.cat([s["param"] for s in state["shards"]])


def _save(run_dir: str, steps: int, state: dict[str, Any], keep: int) -> str:
    """Write the state and its manifest into a hidden staging directory, then rename it into place: a
    checkpoint_step directory is complete or absent."""
    name = f"checkpoint_step{steps:08d}"
    staging = os.path.join(run_dir, f".tmp-{name}-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    write_atomic(os.path.join(staging, STATE_FILE), lambda f: torch.save(state, f))
    write_manifest(staging, steps)
    final = os.path.join(run_dir, name)
    publish_dir(staging, final)
    _prune(run_dir, steps, keep)
    return final


def _prune(run_dir: str, newest: int, keep: int) -> None:
    """Keep the checkpoint just written and the keep-1 newest valid ones before it. Anything after it is from a
    session that ended in a broken save (resume chose an older one), and staging leftovers are from killed saves."""
    kept = 1
    for step, path in checkpoint_dirs(run_dir):
        if step == newest:
            continue
        if step < newest and kept < keep and verify(path, required=STATE_FILE) is None:
            kept += 1
            continue
        shutil.rmtree(path, ignore_errors=True)
    for leftover in glob.glob(os.path.join(run_dir, ".tmp-checkpoint_step*")) + glob.glob(os.path.join(run_dir, ".old-checkpoint_step*")):
        shutil.rmtree(leftover, ignore_errors=True)


@dataclass(frozen=True)
class Budget:
    """The run's length in steps; a step is one worker's gradient update, so the sample budget matches sync DDP's,
    where one step takes a batch from every worker."""

    total: int
    """Steps the whole run takes (the LR schedule spans them)."""
    session: int
    """Steps shard 0 grants in this session: `total`, or fewer when the run stops early (train.stop_at_step)."""
    per_epoch: int
    """An epoch's worth of steps, spread over the workers: the evaluation period."""
    checkpoint_every: int

    @classmethod
    def of(cls, cfg: Config, num_train: int) -> "Budget":
        W = cfg.scaling.max_workers
        per_worker_epoch = sharding.steps_per_epoch(num_train, W, cfg.train.batch_size)  # as sync's, per worker
        total = W * (cfg.train.max_steps or cfg.train.epochs * per_worker_epoch)
        session = min(total, cfg.train.stop_at_step) if cfg.train.stop_at_step else total
        per_epoch = W * per_worker_epoch
        return cls(total, session, per_epoch, cfg.checkpoint.every_steps or per_epoch)


class _Evaluator:
    """Scores the servers' current parameters on the test split, here in the driver."""

    def __init__(self, cfg: Config, data):
        self.cfg, self.data = cfg, data
        self.model = build_model(cfg.model, data)
        self.params, _ = flatten_(self.model)
        self.ctx = SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"))

    def __call__(self, replies: list[PullReply], bounds: list[tuple[int, int]]) -> dict[str, float]:
        for (a, b), reply in zip(bounds, replies):
            self.params[a:b].copy_(as_tensor(reply.params))
        return evaluate(self.model, self.data, self.cfg, self.ctx)


class AsyncPSRun:
    """One session of an async PS run: check, place, restore, train to the session's budget, checkpoint, summarise."""

    def __init__(self, cfg: Config, ray_address: str = "local", started: float | None = None):
        self.cfg, self.ray_address = cfg, ray_address
        self.started = time.perf_counter() if started is None else started
        K = cfg.async_ps.num_servers
        self.data = load_splits(cfg.data)
        check_async(cfg, self.data)  # run_job has checked this before Ray started; again for direct callers
        torch.manual_seed(cfg.train.seed)  # the same initial weights as sync DDP's
        self.init, _ = flatten_(build_model(cfg.model, self.data))
        self.bounds = slice_bounds(self.init.numel(), K)
        self.budget = Budget.of(cfg, len(self.data.train))
        # Checkpoints count from the last one: the steps done jump by what the workers did between two polls.
        self.cadence = Cadence(report_every_s=cfg.train.report_every_s,
                               checkpoint=Every(self.budget.checkpoint_every, since_last=True))
        self.grant_limit = self.budget.session  # what shard 0 may grant; a stop request lowers it
        self.watchdog: Watchdog | None = None  # per start of the actors (`_watch`)
        self._restore(latest_checkpoint(cfg.run.run_dir))
        self.resumed_from = self.steps if self.restore else None
        self.start_done = dict(self.done)  # the workers' positions when this session began
        self.restarts = 0
        self.t0: float | None = None  # time.time() when training began; metrics' time_s and train_time_s count from it
        self.window: list[dict[str, Any]] = []  # update records of the current progress window (train.report_every_s)
        self.last_losses: list[float] = []  # the newest loss of up to one step per worker
        self.scores = {"test_loss": float("nan"), "test_accuracy": float("nan")}
        self.stop_reason: str | None = None

    def _restore(self, checkpoint_dir: str | None) -> None:
        """Start from this checkpoint's servers and data positions, or from the initial parameters (None)."""
        K, W = self.cfg.async_ps.num_servers, self.cfg.scaling.max_workers
        self.restore: dict[str, Any] | None = None
        self.done: dict[int, int] = {}  # worker -> steps of its shard of the data already done: where it starts
        if checkpoint_dir:
            self.restore = torch.load(os.path.join(checkpoint_dir, STATE_FILE), map_location="cpu", weights_only=False)
            if len(self.restore["shards"]) != K:
                raise UsageError(f"{checkpoint_dir} holds {len(self.restore['shards'])} server shards but "
                                 f"async_ps.num_servers={K}: keep the shard count or use a new run.name")
            self.done = {int(k): v for k, v in self.restore["shards"][0]["done"].items()}
            if self.restore["workers"] != W:  # other shards of the data now: each worker starts at the average position
                self.done = {k: sum(self.done.values()) // W for k in range(W)}
        self.steps = self.restore["steps"] if self.restore else 0

    # ---- placing the actors ------------------------------------------------------------------------

    def _check_resources(self) -> None:
        import ray

        cfg = self.cfg
        need = cfg.scaling.max_workers * cfg.scaling.cpus_per_worker + cfg.async_ps.num_servers * cfg.async_ps.cpus_per_server
        have = ray.cluster_resources().get("CPU", 0)
        if need > have:
            raise UsageError(
                f"the async job needs {need:g} CPUs (scaling.num_workers x scaling.cpus_per_worker + async_ps.num_servers"
                f" x async_ps.cpus_per_server) but the Ray cluster has {have:g}")
        gpus = ray.cluster_resources().get("GPU", 0)
        if cfg.scaling.use_gpu and gpus < cfg.scaling.max_workers:
            raise UsageError(f"scaling.use_gpu needs {cfg.scaling.max_workers} GPUs; the Ray cluster has {gpus:g}")

    def _start_actors(self, pg) -> None:
        """Server shards (restored when there is a checkpoint to start from), the staleness gate if any, and
        workers, each added to self.crew as it is created so that it can be named should it die while starting."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        from raydist.strategies.async_ps.gate import StalenessGate
        from raydist.strategies.async_ps.server import ParameterShard
        from raydist.strategies.async_ps.worker import DownpourWorker

        cfg, ps, W, crew = self.cfg, self.cfg.async_ps, self.cfg.scaling.max_workers, self.crew
        config = cfg.to_dict()
        named = self.view.options  # 'raydist/<run>/server-0', ...: readable in the dashboard's actor lists
        # Servers that reserve no CPU fit on any node: pinned where raydist.strategies.async_ps.placement says. Ones that reserve
        # CPUs go where Ray finds them free, spread as far as it can (a pin could wait for ever on a full node).
        spread = ps.server_placement == "spread"
        nodes = self._shard_nodes(pg, ps.num_servers) if spread and ps.cpus_per_server == 0 else []
        for i, (a, b) in enumerate(self.bounds):
            # Hard affinity: with soft=True, Ray 2.60 placed these 0-CPU actors wherever it liked (measured on the
            # emulated cluster: 0 of 6 on the node asked for). The nodes are the ones alive at this start.
            placement = ({"scheduling_strategy": NodeAffinitySchedulingStrategy(nodes[i], soft=False)} if nodes else
                         {"scheduling_strategy": "SPREAD"} if spread else {})
            shard = ray.remote(ParameterShard).options(num_cpus=ps.cpus_per_server, **placement,
                                                       **named("server", i)).remote(
                i, self.init[a:b].numpy(), config, self.budget.total, self.grant_limit)
            crew.shards.append(crew.add(shard, f"server shard {i}"))
        if self.restore:
            ray.get([s.load_state_dict.remote(st, self.done) for s, st in zip(crew.shards, self.restore["shards"])])
        if ps.on_stale == "wait" and ps.max_staleness >= 0:
            crew.gate = crew.add(ray.remote(StalenessGate).options(num_cpus=0, **named("gate")).remote(ps.max_staleness),
                                 "staleness gate")
        for k in range(W):
            worker = ray.remote(DownpourWorker).options(
                num_cpus=cfg.scaling.cpus_per_worker, num_gpus=1 if cfg.scaling.use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=k),
                **named("worker", k),
            ).remote(config, k, W, crew.shards, self.bounds, crew.gate)
            crew.workers.append(crew.add(worker, f"worker {k}"))
        crew.locate()  # data loaded: start the clock together
        servers = ", ".join(actor_name(cfg.run.name, "server", i, self.view.attempt) for i in range(len(crew.shards)))
        # Server shard 0 stands in for the controller: it hands out the run's steps and dies with the driver.
        self.view.running(crew.workers, crew.shards[0], f"parameter server shards: {servers}")

    @staticmethod
    def _shard_nodes(pg, num_servers: int) -> list[str]:
        """Node ids for the shards (raydist.strategies.async_ps.placement): alive nodes by hostname, the workers' from their bundles."""
        import ray
        from ray.util import placement_group_table

        from raydist.strategies.async_ps.placement import shard_nodes

        alive = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: (n["NodeManagerHostname"], n["NodeID"]))
        workers = list(placement_group_table(pg)["bundles_to_node_id"].values())
        return shard_nodes(num_servers, [n["NodeID"] for n in alive], workers)

    def _wait_placed(self, pg) -> None:
        """Wait for the workers' bundles: at the start, and after a failure, when Ray may be re-placing the
        bundles of a node that died."""
        import ray

        try:
            ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            W = self.cfg.scaling.max_workers
            raise RaydistError(f"could not place {W} workers within {PLACEMENT_TIMEOUT_S} s (free CPUs/GPUs?)") from None

    def run(self) -> JobSummary:
        """Train to the session's budget. When an attempt ends, `policy.decide` says what follows: the summary, a
        restart of every actor from the latest checkpoint (see `_recover` for why all of them), or the failure."""
        from ray.util.placement_group import remove_placement_group

        self._check_resources()
        pg = self._placement_group()
        self._open()
        completed = False
        try:
            while True:
                event, summary = self._attempt(pg)
                decision = policy.decide(event, self.restarts, self.cfg.scaling.max_failures)
                if decision.kind is policy.Kind.RAISE:
                    raise RaydistError(decision.reason)
                if decision.kind is policy.Kind.CONTINUE:
                    completed = True
                    self.view.end(stop_reason=summary.stop_reason)
                    return summary
                self.view.restarting(event.detail)
                self._recover(event, decision)
        except BaseException as e:
            self.view.end(error=e)
            raise
        finally:
            self.bar.close(completed=completed)
            self.log.close()
            remove_placement_group(pg)

    def _placement_group(self):
        """One bundle per worker, spread over the nodes as far as the cluster allows. It outlives restarts: Ray
        re-places the bundles of a dead node by itself."""
        from ray.util.placement_group import placement_group

        s = self.cfg.scaling
        bundle = {"CPU": s.cpus_per_worker, **({"GPU": 1} if s.use_gpu else {})}
        return placement_group([bundle] * s.max_workers, strategy="SPREAD")

    def _open(self) -> None:
        """What the session shows and writes: metrics.jsonl, the console's progress bar, the dashboard's run."""
        cfg, s = self.cfg, self.cfg.scaling
        self.log = RunLog(cfg, enabled=True, start_step=self.steps, samples_per_step=cfg.train.batch_size)
        self.evaluator = _Evaluator(cfg, self.data)
        print(start_line(STRATEGY, cfg.run.run_dir), file=sys.stderr, flush=True)
        # One async step is one worker's gradient on train.batch_size samples.
        self.bar = ProgressBar(STRATEGY, self.budget.total, samples_per_step=cfg.train.batch_size,
                               export=Exporter(cfg.run.name, STRATEGY, "driver", 0))
        self.view = TrainView(RunDescription(
            name=cfg.run.name, strategy=STRATEGY, num_workers=s.max_workers, cpus_per_worker=s.cpus_per_worker,
            use_gpu=s.use_gpu, max_failures=s.max_failures, storage_dir=cfg.run.storage_dir,
            config=cfg.to_dict(), backend={"num_servers": cfg.async_ps.num_servers}, keep=cfg.checkpoint.keep))

    def _attempt(self, pg) -> tuple[policy.Event, JobSummary | None]:
        """One start of every actor, trained to the end of the session's budget; how it ended, and the summary
        when it did not fail."""
        import ray

        from raydist.errors import last_error_line

        self._wait_placed(pg)
        self.crew = Crew()
        try:
            self._start_actors(pg)
            summary = self._finish(self._watch())
            return policy.Event(policy.Outcome.FINISHED, self.steps), summary
        except ray.exceptions.RayActorError as e:
            if e.actor_init_failed:
                return policy.Event(policy.Outcome.INIT_FAILED, self.steps, last_error_line(e)), None
            return policy.Event(policy.Outcome.DIED, self.steps, str(self.crew.death(e))), None
        except Hung as e:
            return policy.Event(policy.Outcome.HUNG, self.steps, str(e.death)), None
        except ray.exceptions.RayError as e:
            return policy.Event(policy.Outcome.ERROR, self.steps, last_error_line(e)), None
        finally:
            self.crew.kill()

    def _recover(self, event: policy.Event, decision: policy.Decision) -> None:
        """Count the failure and go back to the latest checkpoint.

        Every shard rolls back, not only a dead one: a worker's last gradient may have reached some shards and not
        others, and only one checkpoint in which all shards agree on each worker's steps (`_checkpoint`) makes sure
        that no gradient is applied twice or on some shards only. The workers restart at the data positions that
        checkpoint records and shard 0 grants the budget from there, so the run still takes exactly its budget;
        the steps since that checkpoint are computed again."""
        self.restarts = decision.restarts
        self.bar.export.observe(restarts=decision.restarts)
        self._restore(latest_checkpoint(self.cfg.run.run_dir))
        self.log.restart(self.steps)  # TensorBoard hides the failed attempt's points after that checkpoint
        origin = f"checkpoint step {self.steps}" if self.restore else "the initial parameters"
        print(f"[raydist] async: {event.describe()}; restarting servers and workers from {origin} ({decision.reason})",
              flush=True)

    # ---- watching the run --------------------------------------------------------------------------

    def _watch(self) -> list[WorkerReport]:
        """Start the workers, then until they finish: log their steps and act on what the schedule says is due
        (`_act`); a worker that fails, dies or hangs ends the attempt here."""
        import ray

        if self.t0 is None:
            self.t0 = time.time()
        runs = self.crew.runs = [w.run.remote(self.done.get(k, 0), self.t0) for k, w in enumerate(self.crew.workers)]
        self.bar.new_session(self.steps)
        self.schedule = Schedule.starting(self.cadence, self.steps, time.perf_counter(), self._epochs())
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
            self._act(self.schedule.due(self.steps, time.perf_counter(), epochs=self._epochs()))
        self.train_time_s = time.time() - self.t0
        return ray.get(runs)

    def _epochs(self) -> int:
        """Epochs' worth of steps done: evaluations follow them, as sync's follow its epoch ends."""
        return self.steps // self.budget.per_epoch

    def _act(self, due: Due) -> None:
        """At one poll: evaluate, show progress (a plain line about every train.report_every_s with run.verbose),
        checkpoint and ask whether to stop, as due."""
        if due.evaluate:
            self._evaluate()
            self.schedule.evaluated(self._epochs())
        self._show_progress()
        if due.report:
            if self.cfg.run.verbose:
                print(self.bar.plain_line(), flush=True)
            self.window.clear()
            self.schedule.reported(time.perf_counter())
        if due.checkpoint:
            self._checkpoint()
        if due.stop_poll and self.stop_reason is None:
            self.schedule.polled(time.perf_counter())
            self._check_stop()

    def _check_stop(self) -> None:
        """On a stop request or a draining node: grant no more steps; the workers end after the steps they hold,
        and the final checkpoint then covers every step taken (none lost beyond those in flight)."""
        from raydist.cluster.watch import preempted
        from raydist.cluster.preemption import draining_nodes, stop_requested

        request = stop_requested()
        draining = draining_nodes()
        if request is None and not draining:
            return
        if request is not None:
            self.stop_reason = request.describe()
        else:
            self.stop_reason = preempted(draining)
        # A restart after this point restores the lower limit too: the run still stops at this step.
        self.grant_limit = self._ask_shards("stop_granting", shards=self.crew.shards[:1])[0]
        print(f"[raydist] async: stopping after step {self.grant_limit}: {self.stop_reason}", flush=True)

    def _collect(self) -> None:
        drained: Drained = self._ask_shards("drain", shards=self.crew.shards[:1])[0]
        if self.watchdog is not None:
            self.watchdog.saw(drained.records, time.monotonic())
        self.steps = drained.steps_done
        for r in drained.records:
            self.log.write(r)
        self.window.extend(drained.records)
        if drained.records:
            self.last_losses = ([r["loss"] for r in drained.records] + self.last_losses)[: self.cfg.scaling.max_workers]

    def _ask_shards(self, method: str, shards: list | None = None) -> list:
        """Each shard's answer to `method`, bounded by faults.hang_timeout_s (`Crew.ask`): the loop's calls to the
        shards (records, evaluations, checkpoints, the stop) raise Hung naming a shard that answers none."""
        shards = self.crew.shards if shards is None else shards
        return self.crew.ask(shards, [getattr(s, method).remote() for s in shards], self.cfg.faults.hang_timeout_s)

    def _evaluate(self) -> None:
        self.scores = self.evaluator(self._ask_shards("pull"), self.bounds)
        self.log.write({"eval_at_step": self.steps, "time_s": time.time() - self.t0, **self.scores})

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
        self.log.flush()  # TensorBoard's points up to here, on disk before a checkpoint a restart starts after
        path = _save(self.cfg.run.run_dir, at, state, self.cfg.checkpoint.keep)
        self.schedule.checkpointed(at)
        return path

    def _show_progress(self) -> None:
        """The shared progress bar (raydist.observability.console): step of the budget, loss and staleness over the current
        window, the latest test accuracy, samples/s, ETA."""
        applied = [r["staleness"] for r in self.window if "step" in r]
        loss = sum(r["loss"] for r in self.window) / len(self.window) if self.window else None
        accuracy = self.scores["test_accuracy"]
        self.bar.update(self.steps, loss=loss, test_accuracy=None if accuracy != accuracy else accuracy,
                        extra={"staleness": f"{sum(applied) / len(applied):.3g}"} if applied else None)

    def _finish(self, reports: list[WorkerReport]) -> JobSummary:
        """The session's last step: its records, a final evaluation and checkpoint, then the summary."""
        self._collect()
        self._evaluate()
        self._show_progress()
        # Every worker ended with a fetch, which came after its pushes to each shard: the shards agree.
        checkpoint = self._checkpoint()
        return self._summary(reports, self._ask_shards("stats"), checkpoint)

    def _summary(self, reports: list[WorkerReport], stats: list[dict[str, Any]], checkpoint: str | None) -> JobSummary:
        """The session's JobSummary, from the run's state and the server shards' books (`stats`)."""
        cfg, train_s = self.cfg, self.train_time_s
        staleness: Counter = Counter()
        for st in stats:
            staleness.update({int(k): v for k, v in st["staleness"].items()})
        updates = sum(staleness.values())
        # Steps that count, from shard 0's books: a restart's recomputed steps are not counted twice, and the
        # workers that died cannot report theirs.
        steps_per_worker = [stats[0]["done"].get(k, 0) - self.start_done.get(k, 0) for k in range(len(reports))]
        finished = self.steps >= self.budget.total
        return JobSummary(
            strategy=STRATEGY, run_name=cfg.run.name, run_dir=cfg.run.run_dir, ray=self.ray_address,
            workers=len(reports), status="completed" if finished else "stopped",
            steps=self.steps, total_steps=self.budget.total,
            resumed_from_step=self.resumed_from,
            wall_s=round(time.perf_counter() - self.started, 3), train_time_s=train_s,
            test_accuracy=self.scores["test_accuracy"], test_loss=self.scores["test_loss"],
            final_loss=sum(self.last_losses) / len(self.last_losses) if self.last_losses else None,
            samples_per_s=sum(steps_per_worker) * cfg.train.batch_size / train_s,
            steps_per_s=sum(steps_per_worker) / train_s,
            checkpoint=checkpoint, metrics_file=self.log.path,
            **per_worker_summary([{"bytes": r.bytes, "wait_s": r.wait_s} for r in reports]),
            servers=len(self.crew.shards),
            server_hosts=[self.crew.hosts.get(actor_id(s), "?") for s in self.crew.shards],
            staleness_mean=sum(k * v for k, v in staleness.items()) / updates if updates else 0.0,
            staleness_max=max(staleness, default=0), dropped=sum(st["dropped"] for st in stats),
            steps_per_worker=steps_per_worker, restarts=self.restarts,
            stop_reason=None if finished else self.stop_reason or f"train.stop_at_step={cfg.train.stop_at_step}",
        )


def train(cfg: Config, ray_address: str = "local", started: float | None = None) -> JobSummary:
    """One session on the already connected Ray (tests call this directly)."""
    return AsyncPSRun(cfg, ray_address, started).run()


def run(cfg: Config, spec: registry.StrategySpec, session) -> JobSummary:
    """The registry's driver: everything checkable is checked before Ray starts."""
    from raydist.driver.session import connect

    job = AsyncPSRun(cfg, started=session.started)
    job.ray_address = session.ray = connect(cfg)
    return job.run()
