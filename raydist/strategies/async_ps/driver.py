"""jobs/async.py's driver: places the server shards and workers, watches them, evaluates, checkpoints and resumes.

Built as Ray Train V2's controller is: the session moves through explicit states (`run_state`), a pure policy
decides what follows each start of the actors (`policy.decide`), and this controller acts on it. The pieces it
acts with live beside it: `crew_start` (placing and starting the actors), `training` (the loop of one start:
records, evaluations, checkpoints, the stop), `progress` (what the session shows and writes), `checkpoints`,
`session_summary`.
"""

from __future__ import annotations

import sys
import time

import torch

from raydist import registry
from raydist.config import Config
from raydist.driver.train_view import RunDescription, TrainView
from raydist.errors import RaydistError
from raydist.observability.console import ProgressBar, start_line
from raydist.observability.ray_metrics import Exporter
from raydist.observability.tensorboard_log import RunLog
from raydist.strategies.async_ps import STRATEGY, policy
from raydist.strategies.async_ps.budget import Budget
from raydist.strategies.async_ps.checkpoints import Resume, latest_checkpoint
from raydist.strategies.async_ps.checks import check_async
from raydist.strategies.async_ps.crew import Crew, Hung
from raydist.strategies.async_ps.crew_start import CrewStart, check_resources, placement_group, wait_placed
from raydist.strategies.async_ps.evaluator import Evaluator
from raydist.strategies.async_ps.progress import Progress
from raydist.strategies.async_ps.run_state import AFTER, Lifecycle, RunState
from raydist.strategies.async_ps.session_summary import Session, summarise
from raydist.strategies.async_ps.training import Ending, Grants, TrainingLoop
from raydist.summary import JobSummary
from raydist.torchkit.data import load_splits
from raydist.torchkit.flat import flatten_, slice_bounds
from raydist.torchkit.models import build_model


class AsyncPSRun:
    """One session of an async PS run: check, place, restore, train to the session's budget, checkpoint, summarise."""

    def __init__(self, cfg: Config, ray_address: str = "local", started: float | None = None):
        self.cfg, self.ray_address = cfg, ray_address
        self.started = time.perf_counter() if started is None else started
        self.lifecycle = Lifecycle()
        self.data = load_splits(cfg.data)
        check_async(cfg, self.data)  # run_job has checked this before Ray started; again for direct callers
        torch.manual_seed(cfg.train.seed)  # the same initial weights as sync DDP's
        self.init, _ = flatten_(build_model(cfg.model, self.data))
        self.bounds = slice_bounds(self.init.numel(), cfg.async_ps.num_servers)
        self.budget = Budget.of(cfg, len(self.data.train))
        self.grants = Grants(self.budget.session)  # a stop request lowers the limit
        self.resume = self._latest_resume()
        self.resumed_from = self.resume.steps if self.resume.shards is not None else None
        self.start_done = dict(self.resume.done)  # the workers' positions when this session began
        self.restarts = 0

    def _latest_resume(self) -> Resume:
        latest = latest_checkpoint(self.cfg.run.run_dir)
        return Resume.read(latest, self.cfg.async_ps.num_servers, self.cfg.scaling.max_workers)

    def run(self) -> JobSummary:
        """Train to the session's budget. When an attempt ends, `policy.decide` says what follows: the summary, a
        restart of every actor from the latest checkpoint (see `_recover` for why all of them), or the failure."""
        from ray.util.placement_group import remove_placement_group

        check_resources(self.cfg)
        pg = placement_group(self.cfg)
        self._open(pg)
        try:
            while True:
                event, summary = self._attempt(pg)
                decision = policy.decide(event, self.restarts, self.cfg.scaling.max_failures)
                state = self.lifecycle.to(AFTER[decision.kind])
                if state is RunState.ERRORED:
                    raise RaydistError(decision.reason)
                if state is RunState.FINISHED:
                    self.view.end(stop_reason=summary.stop_reason)
                    return summary
                self.view.restarting(event.detail)
                self._recover(event, decision)
        except BaseException as e:
            self.lifecycle.fail()
            self.view.end(error=e)
            raise
        finally:
            self.progress.close(completed=self.lifecycle.state is RunState.FINISHED)
            remove_placement_group(pg)

    def _open(self, pg) -> None:
        """What the session shows and writes: metrics.jsonl, the console's progress bar, the dashboard's run."""
        cfg, s = self.cfg, self.cfg.scaling
        log = RunLog(cfg, enabled=True, start_step=self.resume.steps, samples_per_step=cfg.train.batch_size)
        self.evaluator = Evaluator(cfg, self.data, self.bounds)
        print(start_line(STRATEGY, cfg.run.run_dir), file=sys.stderr, flush=True)
        # One async step is one worker's gradient on train.batch_size samples.
        bar = ProgressBar(
            STRATEGY,
            self.budget.total,
            samples_per_step=cfg.train.batch_size,
            export=Exporter(cfg.run.name, STRATEGY, "driver", 0),
        )
        self.progress = Progress(cfg, log, bar, self.resume.steps)
        self.view = TrainView(
            RunDescription(
                name=cfg.run.name,
                strategy=STRATEGY,
                num_workers=s.max_workers,
                cpus_per_worker=s.cpus_per_worker,
                use_gpu=s.use_gpu,
                max_failures=s.max_failures,
                storage_dir=cfg.run.storage_dir,
                config=cfg.to_dict(),
                backend={"num_servers": cfg.async_ps.num_servers},
                keep=cfg.checkpoint.keep,
            )
        )
        self.crew_start = CrewStart(cfg, pg, self.view, self.init, self.bounds, self.budget.total)

    def _attempt(self, pg) -> tuple[policy.Event, JobSummary | None]:
        """One start of every actor, trained to the end of the session's budget; how it ended, and the summary
        when it did not fail."""
        import ray

        from raydist.errors import last_error_line

        self.lifecycle.to(RunState.SCHEDULING)
        wait_placed(pg, self.cfg.scaling.max_workers)
        crew = Crew()
        try:
            self.crew_start.start(crew, self.grants.limit, self.resume)
            loop = TrainingLoop(self.cfg, crew, self.progress, self.grants, self.budget, self.evaluator)
            self.lifecycle.to(RunState.RUNNING)
            reports = loop.watch(self.resume.done)
            self.lifecycle.to(RunState.FINISHING)
            summary = self._summary(loop.finish(reports))
            return policy.Event(policy.Outcome.FINISHED, self.progress.steps), summary
        except ray.exceptions.RayActorError as e:
            if e.actor_init_failed:
                return policy.Event(policy.Outcome.INIT_FAILED, self.progress.steps, last_error_line(e)), None
            return policy.Event(policy.Outcome.DIED, self.progress.steps, str(crew.death(e))), None
        except Hung as e:
            return policy.Event(policy.Outcome.HUNG, self.progress.steps, str(e.death)), None
        except ray.exceptions.RayError as e:
            return policy.Event(policy.Outcome.ERROR, self.progress.steps, last_error_line(e)), None
        finally:
            crew.kill()

    def _summary(self, end: Ending) -> JobSummary:
        session = Session(
            ray_address=self.ray_address,
            wall_s=round(time.perf_counter() - self.started, 3),
            total_steps=self.budget.total,
            resumed_from=self.resumed_from,
            start_done=self.start_done,
            restarts=self.restarts,
            stop_reason=self.grants.stop_reason,
        )
        return summarise(self.cfg, session, self.progress, end)

    def _recover(self, event: policy.Event, decision: policy.Decision) -> None:
        """Count the failure and go back to the latest checkpoint.

        Every shard rolls back, not only a dead one: a worker's last gradient may have reached some shards and not
        others, and only one checkpoint in which all shards agree on each worker's steps (`TrainingLoop._checkpoint`)
        makes sure that no gradient is applied twice or on some shards only. The workers restart at the data
        positions that checkpoint records and shard 0 grants the budget from there, so the run still takes exactly
        its budget; the steps since that checkpoint are computed again."""
        self.restarts = decision.restarts
        self.progress.bar.export.observe(restarts=decision.restarts)
        self.resume = self._latest_resume()
        self.progress.restarted(self.resume.steps)
        origin = f"checkpoint step {self.resume.steps}" if self.resume.shards is not None else "the initial parameters"
        print(
            f"[raydist] async: {event.describe()}; restarting servers and workers from {origin} ({decision.reason})",
            flush=True,
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
