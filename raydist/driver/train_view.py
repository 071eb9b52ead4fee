"""A run of plain Ray actors as the Ray dashboard sees it: readable actor names, and a run in Ray Train's state actor.

The async PS and `raydist launch` are plain Ray actors, not Ray Train, so without this the dashboard lists anonymous
actors and Ray Train's run list (`/api/train/v2/runs/v1`, which sync and local SGD fill through Ray Train) does not
have them. Here every actor gets a name that says run, role and rank, and the run, each start of its actors (an
attempt) and its workers are written to Ray Train's state actor in Ray Train's own schema, so every kind of run
reads the same.

Nothing here may fail the training run: the first failure to register prints one warning line and turns the
registration off for the rest of the run (the actor names stay).
"""

from __future__ import annotations

import os
import sys
import uuid
import warnings
from dataclasses import dataclass, field
from typing import Any

PREFIX = "raydist"
REGISTER_TIMEOUT_S = 10  # a state actor that does not answer in this long is given up on (one warning)


def actor_name(run: str, role: str, index: int | None = None, attempt: int = 0) -> str:
    """'raydist/<run>/worker-1', 'raydist/<run>/server-0', 'raydist/<run>/gate'; a restart's actors add
    '/restart-<n>' (the killed ones of the previous start may still hold their names while they die)."""
    name = f"{PREFIX}/{run}/{role}" + (f"-{index}" if index is not None else "")
    return name + (f"/restart-{attempt}" if attempt else "")


def _whereabouts(_actor: Any) -> dict[str, Any]:
    """Runs inside an actor (through `__ray_call__`): what the Train view shows of a worker."""
    import ray

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "gpu_ids": [int(g) for g in ray.get_gpu_ids() if str(g).isdigit()],
    }


def _torch_version() -> str:
    """torch's version without importing torch, which the drivers that show a run here (`raydist launch`, the async
    PS) need for nothing else: a second of CPU at every start."""
    import sys

    if "torch" in sys.modules:
        return sys.modules["torch"].__version__
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # a build without package metadata (from source, say)
        import torch

        return torch.__version__


def _enabled() -> bool:
    # The same switch as Ray Train's own state tracking (raydist.driver.session turns it on for every job).
    return os.environ.get("RAY_TRAIN_ENABLE_STATE_TRACKING", "0").lower() in ("1", "true")


@dataclass(frozen=True)
class RunDescription:
    """What the dashboard's run list shows of a run's settings."""

    name: str
    strategy: str
    num_workers: int
    cpus_per_worker: float
    use_gpu: bool
    max_failures: int
    storage_dir: str
    config: dict[str, Any] = field(default_factory=dict)
    backend: dict[str, Any] = field(default_factory=dict)
    keep: int = 1


class TrainView:
    """One session of a run of plain Ray actors in the dashboard. The driver names actors through `options`, and
    calls `running` after each start of the actors, `restarting` when they are replaced and `end` once."""

    def __init__(self, run: RunDescription):
        self.desc, self.strategy = run, run.strategy
        self.attempt = 0  # starts of the actors so far, less one: the suffix of the current start's names
        self.run_id = uuid.uuid4().hex
        # Actor names are unique per namespace; one of our own per session keeps a resumed run of the same name in
        # the same driver (tests do that) clear of the previous session's actors while they die.
        self.namespace = f"{PREFIX}-{self.run_id[:12]}"
        self.enabled = _enabled()
        self.actor = None
        self.run = None
        self.attempt_state = None

    def options(self, role: str, index: int | None = None) -> dict[str, Any]:
        """Ray actor options that name one actor of the current start."""
        return {"name": actor_name(self.desc.name, role, index, self.attempt), "namespace": self.namespace}

    # ---- the run in Ray Train's state actor ------------------------------------------------------------------

    def running(self, workers: list, controller: Any, detail: str | None = None) -> None:
        """The actors of this start are up, `workers` in rank order: the run and this attempt are RUNNING.
        `controller` stands in for Ray Train's controller actor: the dashboard shows the run aborted once it is
        dead, so it must be an actor that dies with the driver."""
        self._safely(self._running, workers, controller, detail)

    def restarting(self, why: str) -> None:
        """An actor died or hung: this attempt ERRORED, the run RESTARTING; the next start's names get a suffix."""
        self.attempt += 1
        self._safely(self._attempt_ended, "ERRORED", why, "RESTARTING", None)

    def end(self, error: BaseException | None = None, stop_reason: str | None = None, wait: bool = True) -> None:
        """FINISHED (a completed or stopped session), or ERRORED with the error's line; with `wait`, once the state
        actor has it (a driver that exits next would otherwise take the notice with it)."""
        if error is None:
            self._safely(self._attempt_ended, "FINISHED", stop_reason, "FINISHED", stop_reason, wait)
        else:
            line = str(error).splitlines()[0] if str(error) else type(error).__name__
            self._safely(self._attempt_ended, "ERRORED", line, "ERRORED", line, wait)

    def _safely(self, step, *args) -> None:
        if not self.enabled:
            return
        try:
            step(*args)
        except Exception as e:  # the dashboard is a view: the run goes on without it
            if not self.enabled:  # turned off meanwhile (the run ended): nothing to say
                return
            self.enabled = False
            print(
                f"[raydist] {self.strategy}: the dashboard's Train view will not show this run "
                f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else '-'})",
                file=sys.stderr,
                flush=True,
            )

    def _state_actor(self):
        from raydist.private_api import get_or_create_state_actor

        if self.actor is None:
            self.actor = get_or_create_state_actor()
        return self.actor

    def _put(self, block: bool = False) -> None:
        import ray

        refs = [self._state_actor().create_or_update_train_run.remote(self.run)]
        if self.attempt_state is not None:
            refs.append(self.actor.create_or_update_train_run_attempt.remote(self.attempt_state))
        if block:
            ray.get(refs, timeout=REGISTER_TIMEOUT_S)

    def _running(self, actors: list, controller_actor: Any, detail: str | None) -> None:
        import ray

        from raydist.private_api import actor_id
        from raydist.private_api import state_schema as s

        ActorStatus, RunAttemptStatus, RunStatus = s.ActorStatus, s.RunAttemptStatus, s.RunStatus
        TrainResources, TrainRunAttempt, TrainWorker = s.TrainResources, s.TrainRunAttempt, s.TrainWorker
        from raydist.private_api import state_util

        current_time_ns = state_util.current_time_ns

        d = self.desc
        where = ray.get([w.__ray_call__.remote(_whereabouts) for w in actors], timeout=REGISTER_TIMEOUT_S)
        per_worker = {"CPU": d.cpus_per_worker, **({"GPU": 1} if d.use_gpu else {})}
        nodes: list[str] = []  # node ids in the order of their first worker: node_rank
        workers = []
        for rank, (actor, w) in enumerate(zip(actors, where)):
            if w["node_id"] not in nodes:
                nodes.append(w["node_id"])
            workers.append(
                TrainWorker(
                    world_rank=rank,
                    local_rank=sum(1 for v in where[:rank] if v["node_id"] == w["node_id"]),
                    node_rank=nodes.index(w["node_id"]),
                    actor_id=actor_id(actor),
                    node_id=w["node_id"],
                    node_ip=w["node_ip"],
                    pid=w["pid"],
                    gpu_ids=w["gpu_ids"],
                    status=ActorStatus.ALIVE,
                    resources=TrainResources(resources=per_worker),
                )
            )
        self.attempt_state = TrainRunAttempt(
            run_id=self.run_id,
            attempt_id=f"{self.run_id}-{self.attempt}",
            status=RunAttemptStatus.RUNNING,
            status_detail=detail,
            start_time_ns=current_time_ns(),
            resources=[TrainResources(resources=per_worker) for _ in workers],
            workers=workers,
        )
        # The dashboard takes a RUNNING run whose controller actor is dead for aborted; these runs have no
        # controller actor (the driver is one), so one of theirs that dies with the driver stands in.
        controller = actor_id(controller_actor)
        if self.run is None:
            self.run = self._new_run(controller)
        self.run.controller_actor_id = controller
        self.run.status, self.run.status_detail = RunStatus.RUNNING, None
        self._put()

    def _attempt_ended(
        self,
        attempt_status: str,
        attempt_detail: str | None,
        run_status: str,
        run_detail: str | None,
        wait: bool = True,
    ) -> None:
        from raydist.private_api import state_schema, state_util

        RunAttemptStatus, RunStatus = state_schema.RunAttemptStatus, state_schema.RunStatus
        current_time_ns, mark_workers_dead = state_util.current_time_ns, state_util.mark_workers_dead

        if self.run is None:  # the actors never came up: there is nothing to show
            return
        if self.attempt_state is not None and not self.attempt_state.status.is_terminal():
            self.attempt_state.status = RunAttemptStatus(attempt_status)
            self.attempt_state.status_detail = attempt_detail
            self.attempt_state.end_time_ns = current_time_ns()
            mark_workers_dead(self.attempt_state)
        self.run.status, self.run.status_detail = RunStatus(run_status), run_detail
        if self.run.status.is_terminal():
            self.run.end_time_ns = current_time_ns()
        self._put(block=wait)  # before the driver exits and the actor's queue with it

    def _new_run(self, controller: str):
        import ray

        from raydist.private_api import DataConfig, state_schema, state_util

        s = state_schema
        BackendConfig, CheckpointConfig, FailureConfig, RunConfig = (
            s.BackendConfig,
            s.CheckpointConfig,
            s.FailureConfig,
            s.RunConfig,
        )
        RunSettings, RunStatus, ScalingConfig, TrainRun = s.RunSettings, s.RunStatus, s.ScalingConfig, s.TrainRun
        construct_data_config, current_time_ns = state_util.construct_data_config, state_util.current_time_ns

        d = self.desc
        with warnings.catch_warnings():  # Ray Data's default options set a field it has deprecated: not ours to see
            warnings.simplefilter("ignore")
            data_config = construct_data_config(DataConfig())
        settings = RunSettings(
            train_loop_config=d.config,
            backend_config=BackendConfig(framework=None, config={"strategy": self.strategy, **d.backend}),
            scaling_config=ScalingConfig(
                num_workers=d.num_workers,
                use_gpu=d.use_gpu,
                resources_per_worker={"CPU": d.cpus_per_worker},
                placement_strategy="SPREAD",
                use_tpu=False,
            ),
            datasets=[],
            data_config=data_config,
            run_config=RunConfig(
                name=d.name,
                failure_config=FailureConfig(max_failures=d.max_failures, controller_failure_limit=0),
                worker_runtime_env={},
                checkpoint_config=CheckpointConfig(num_to_keep=d.keep, checkpoint_score_order="max"),
                storage_path=d.storage_dir,
            ),
        )
        return TrainRun(
            id=self.run_id,
            name=d.name,
            job_id=ray.get_runtime_context().get_job_id(),
            controller_actor_id=controller,
            status=RunStatus.RUNNING,
            start_time_ns=current_time_ns(),
            framework_versions={"ray": ray.__version__, "torch": _torch_version()},
            run_settings=settings,
        )
