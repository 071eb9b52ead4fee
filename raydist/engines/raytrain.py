"""The driver of every loop strategy: Ray Train with its torch backend (raydist.engines.raytrain_trainer) running
`raydist.engines.raytrain_worker.train_worker`, and the summary read from its final report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import time
import uuid
from pathlib import Path

from raydist import registry
from raydist.config import Config
from raydist.driver.session import Session, connect, process_start_time
from raydist.engines.raytrain_trainer import PLACEMENT_GROUP_FILE, release_placement_group
from raydist.engines.raytrain_worker import FAILURE_FILE, train_worker
from raydist.errors import RaydistError, last_error_line
from raydist.observability.metrics import METRICS_FILE
from raydist.summary import JobSummary

ELASTIC_PLACEMENT_RETRIES = 3


def hung_worker(error: BaseException, cfg: Config) -> str | None:
    """'rank R on node H (pid P) stopped answering ...' when Ray Train gave a worker up for not answering its
    health check (a stopped or frozen process), else None. Ray's message holds the worker's repr: read it there."""
    from raydist.private_api import WorkerHealthCheckTimeoutError

    failures = getattr(error, "worker_failures", None) or {}
    for rank, failure in sorted(failures.items()):
        if isinstance(failure, WorkerHealthCheckTimeoutError):
            text = str(failure)
            host = re.search(r"hostname='([^']*)'", text)
            pid = re.search(r"pid=(\d+)", text)
            waited = re.search(r"hanging for ([\d.]+) seconds", text)
            return (
                f"rank {rank} on node {host.group(1) if host else '?'} (pid {pid.group(1) if pid else '?'}) "
                f"stopped answering for {float(waited.group(1)) if waited else cfg.faults.hang_timeout_s:.0f} s "
                f"(faults.hang_timeout_s={cfg.faults.hang_timeout_s:g}): a stopped or frozen process"
            )
    return None


def failure_line(error: BaseException, cfg: Config, dead: list[str], lost: list[str] = ()) -> str:
    """The one line a failed Ray Train run ends with; a worker group that no longer fits names the dead nodes (`lost`:
    those that died during the run, where a replica group that could not be replaced on its node says so), a
    worker that stopped answering is named by rank and node."""
    reason = hung_worker(error, cfg) or last_error_line(error)
    if (dead and "startup timed out" in reason) or lost:
        s = cfg.scaling
        want = f"{s.min_workers} to {s.max_workers}" if s.elastic else str(s.max_workers)
        waited = f"waited scaling.node_loss_timeout_s={s.node_loss_timeout_s:g} s; " if not lost else ""
        return (
            f"training failed: {want} workers no longer fit the cluster after node(s) died: "
            f"{'; '.join(lost or dead)} ({waited}a range such as "
            f"scaling.num_workers={max(1, s.min_workers - 1 if s.elastic else s.max_workers - 1)}-{s.max_workers} "
            f"continues on fewer)"
        )
    return f"training failed: {reason}" + (f"; dead node(s): {'; '.join(dead)}" if dead else "")


def refit_after_node_loss(cfg: Config, lost: list[str], unplaced: bool, refits: int) -> str | None:
    """Whether a failed run starts again, and the line saying so. Ray Train 2.60 replaces a failed replica group
    (heal) only in place, on its own node, and its elastic resize does not apply to replica groups: when the node is
    gone the replacement fails. An elastic run then starts again on the workers that fit, from its latest
    checkpoint, as an elastic sync run does. `lost`: the nodes that died since the run started; `unplaced`: Ray
    Train's controller failed (a worker group it could not place or replace). Ray may count a lost node's CPUs for a while
    longer (its autoscaling coordinator looks every 20 s): a start that then times out is tried again. Each start
    counts against scaling.max_failures."""
    s = cfg.scaling
    if not (lost and unplaced and s.elastic) or (s.max_failures != -1 and refits >= s.max_failures):
        return None
    if refits:  # the start before this one timed out: Ray still counted the lost node's CPUs
        return f"[raydist] the workers did not fit yet; starting again (scaling.max_failures={s.max_failures})"
    return (
        f"[raydist] node(s) died: {'; '.join(lost)}; their replica cannot be replaced in place: starting again "
        f"on the {s.min_workers} to {s.max_workers} workers that fit, from the latest checkpoint"
    )


def build_trainer(cfg: Config, spec: registry.StrategySpec):
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

    from raydist.engines.raytrain_backend import QuietTorchConfig
    from raydist.engines.raytrain_trainer import torch_trainer
    from raydist.observability.console import ray_train_log_level

    s = cfg.scaling
    torch_config = (
        spec.load("torch_config")(cfg)
        if spec.torch_config
        else QuietTorchConfig(
            backend=cfg.scaling.resolved_backend, timeout_s=max(1, round(cfg.faults.collective_timeout_s))
        )
    )
    # Read by Ray Train's controller (it propagates these variables): how long placing a worker group may take,
    # how long a worker may leave a health check unanswered (a SIGSTOPped or frozen process answers none; a rank
    # merely waiting in a collective still does, from its actor's own thread), and how long Ray Train's own
    # barriers (report, preemption check) wait.
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(s.node_loss_timeout_s)
    os.environ["RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S"] = str(cfg.faults.hang_timeout_s)
    os.environ["RAY_TRAIN_COLLECTIVE_TIMEOUT_S"] = str(cfg.faults.collective_timeout_s)
    return torch_trainer(
        train_loop_per_worker=train_worker,
        # fit_id: one per fit(), so that workers can tell the group's first start from a replacement's.
        train_loop_config={"config": cfg.to_dict(), "strategy": spec.name, "fit_id": uuid.uuid4().hex},
        scaling_config=ScalingConfig(
            # A range selects Ray Train's elastic policy: restart from the checkpoint with the workers that fit.
            num_workers=(s.min_workers, s.max_workers) if s.elastic else s.max_workers,
            elastic_resize_monitor_interval_s=s.resize_check_s,
            use_gpu=s.use_gpu,
            resources_per_worker={"CPU": s.cpus_per_worker, **({"GPU": 1} if s.use_gpu else {})},
        ),
        # The process group's timeout bounds its start-up and every gloo collective (NCCL's too, with its
        # watchdog): a peer that is alive but never joins fails the step instead of hanging it.
        torch_config=torch_config,
        run_config=RunConfig(
            name=cfg.run.name,
            storage_path=cfg.run.storage_dir,
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            # A worker group that cannot be placed again (a lost node) is a controller failure; Ray's default
            # retries those forever. A fixed count gets none: the start timeout (scaling.node_loss_timeout_s) is
            # the bound. An elastic run gets a few, because Ray may still count a lost node as alive (until its
            # heartbeats time out) and first try, in vain, to place as many workers as before. A backend that
            # replaces replica groups in place gets none either: Ray would retry the replacement on the lost node's
            # slot, and wait for it for ever (`refit_after_node_loss` starts such a run again instead).
            failure_config=FailureConfig(
                max_failures=s.max_failures,
                max_preemption_failures=s.max_preemptions,
                controller_failure_limit=ELASTIC_PLACEMENT_RETRIES if s.elastic and not in_place(torch_config) else 0,
            ),
            # Ray Train's INFO lines (worker group started, checkpoint created, ...) stay in its log files; on the
            # console only with run.verbose.
            logging_config=LoggingConfig(log_level=ray_train_log_level(cfg.run.verbose)),
        ),
    )


def in_place(torch_config) -> bool:
    """Whether Ray Train replaces a failed replica group of this backend alone, leaving the others running."""
    return bool(getattr(torch_config.backend_cls, "has_replica_groups", False))


def start_autoscaling_coordinator() -> None:
    """Start Ray's autoscaling coordinator now, through Ray's own get-or-create (a detached named actor), so that it
    starts beside the controller instead of after it. Ray Train 2.60's controller asks it for resources at start and
    waits up to 5 s for the answer, on the path to the first step: a fresh process importing Ray Data. Started here, it
    is up by then (docs/dev/startup-changes.md has the before and after); on a slow start (the GPU machine's first run)
    the 5 s ran out and Ray printed a traceback. A Ray without this function starts it the old way."""
    try:
        from raydist.private_api import get_or_create_autoscaling_coordinator

        get_or_create_autoscaling_coordinator()
    except Exception:  # noqa: BLE001  (a speed-up only: Ray Train creates it itself when this cannot)
        pass


def fit_on_ray_train(cfg: Config, spec: registry.StrategySpec, session: Session) -> JobSummary:
    """Run a loop strategy on Ray Train; its summary comes from the final checkpoint's report."""
    from raydist.cluster.watch import dead_nodes

    # run_job checked the config (check_before_ray); connect checks what a named cluster can hold.
    session.ray = connect(cfg)
    connected = time.time()
    start_autoscaling_coordinator()
    failure = Path(cfg.run.run_dir) / FAILURE_FILE
    dead_before, refits = set(dead_nodes()), 0
    while True:
        trainer = build_trainer(cfg, spec)
        try:
            result = _fit(trainer, cfg, spec, failure)
            break
        except Exception as e:  # TrainingFailedError, and the controller's own failures, which arrive as other types
            from ray.train import ControllerError

            release_placement_group(cfg.run.run_dir)
            # a replacement refused for a node whose raylet stopped answering: Ray marks it dead within seconds
            wait_s = cfg.scaling.node_loss_timeout_s if "cannot be replaced in place" in str(e) else 0
            lost = _newly_dead(dead_before, wait_s) if in_place(trainer.backend_config) else []
            dead = dead_nodes()
            again = refit_after_node_loss(cfg, lost, isinstance(e, ControllerError), refits)
            if again is None:
                raise RaydistError(failure_line(e, cfg, dead, lost)) from None
            print(again, flush=True)
            refits += 1
    Path(cfg.run.run_dir, PLACEMENT_GROUP_FILE).unlink(missing_ok=True)  # Ray Train removed it
    if failure.exists():
        raise RaydistError(f"training failed: {json.loads(failure.read_text())['reason']}")
    return summary_of(result, cfg, session, connected, trainer.train_loop_config["fit_id"])


def _newly_dead(before: set[str], wait_s: float) -> list[str]:
    """The nodes Ray counts dead that it did not in `before`, waiting up to `wait_s` for one."""
    from raydist.cluster.watch import dead_nodes

    deadline = time.monotonic() + wait_s
    while True:
        lost = [n for n in dead_nodes() if n not in before]
        if lost or time.monotonic() >= deadline:
            return lost
        time.sleep(0.5)


def _fit(trainer, cfg: Config, spec: registry.StrategySpec, failure: Path):
    """One `trainer.fit()`, with the console's progress bar and the driver's node watcher around it."""
    from raydist.cluster.watch import NodeWatcher
    from raydist.observability.console import MetricsTail, ProgressBar, start_line
    from raydist.observability.ray_metrics import Exporter
    from raydist.torchkit.checkpoint import set_aside_broken_snapshot

    moved = set_aside_broken_snapshot(cfg.run.run_dir)  # Ray would refuse to start on a truncated snapshot
    if moved:
        print(moved, flush=True)
    failure.unlink(missing_ok=True)  # an earlier session's
    print(start_line(spec.name, cfg.run.run_dir), file=sys.stderr, flush=True)
    bar = ProgressBar(spec.name, export=Exporter(cfg.run.name, spec.name, "driver", 0))
    tail = MetricsTail(os.path.join(cfg.run.run_dir, METRICS_FILE), bar).start()
    completed = False
    try:
        with NodeWatcher():
            result = trainer.fit()
        completed = True
    finally:
        tail.stop()
        bar.close(completed=completed and not failure.exists())
    return result


def summary_of(
    result, cfg: Config, session: Session, connected: float, fit_id: str = "", since: float | None = None
) -> JobSummary:
    """The job's summary from rank 0's final report (`raydist.train.loop`'s metrics): Ray Train's result, or the
    loop's own file of it when that is newer (`raydist.train.result`). `since`: when this job's first start began
    (`connected` unless its workers started before Ray was up: the launch engine on the embedded instance)."""
    from raydist.train.result import newer_final_result

    since = connected if since is None else since

    m = result.metrics or {}
    checkpoint = result.checkpoint.path if result.checkpoint else None
    newer = newer_final_result(cfg.run.run_dir, fit_id, m.get("step")) if fit_id else None
    if newer:
        m, checkpoint = newer[0], newer[1] or checkpoint
    comm = m.get("comm") or {}
    memory = m.get("memory") or {}
    total = m.get("total_steps")
    return JobSummary(
        strategy=session.job,
        run_name=cfg.run.name,
        run_dir=cfg.run.run_dir,
        ray=session.ray,
        workers=m.get("world_size", cfg.scaling.max_workers),
        status="completed" if total is not None and m.get("step") == total else "stopped",
        steps=m.get("step", 0),
        total_steps=total if total is not None else 0,
        resumed_from_step=m.get("resumed_from_step"),
        wall_s=round(time.perf_counter() - session.started, 3),
        train_time_s=m.get("train_time_s"),
        test_accuracy=m.get("test_accuracy"),
        test_loss=m.get("test_loss"),
        final_loss=m.get("loss"),
        samples_per_s=m.get("samples_per_s"),
        steps_per_s=m.get("steps_per_s"),
        checkpoint=checkpoint,
        metrics_file=os.path.join(cfg.run.run_dir, "metrics.jsonl"),
        bytes_per_worker=comm.get("bytes_per_worker", []),
        wait_s_per_worker=comm.get("wait_s_per_worker", []),
        peak_memory_bytes_per_worker=memory.get("peak_memory_bytes_per_worker", []),
        param_bytes_per_worker=memory.get("param_bytes_per_worker", []),
        stop_reason=m.get("stop_reason"),
        startup_s=startup_seconds(os.path.join(cfg.run.run_dir, METRICS_FILE), connected, since),
        restarts=restarts_of(os.path.join(cfg.run.run_dir, METRICS_FILE), since),
        **own_fields(session.job, m),
    )


def own_fields(job: str, metrics: dict) -> dict:
    """The summary fields the job's registry entry declares, from rank 0's final report (`FinalMetrics.final_metrics`)."""
    spec = registry.get(job)
    if not spec.summary_fields:
        return {}
    return {f.name: metrics[f.name] for f in dataclasses.fields(spec.load("summary_fields")) if f.name in metrics}


def _our_startups(metrics_file: str, since: float) -> list[dict[str, float]]:
    """Rank 0's `startup` records written after `since`: one per start of its training function in this job."""
    from raydist.observability.metrics import startup_records

    try:
        return [s for s in startup_records(metrics_file) if s["worker_entered"] >= since]
    except (OSError, ValueError, KeyError):
        return []


def restarts_of(metrics_file: str, since: float) -> int:
    """Times this job's worker group restarted from a checkpoint: rank 0's later starts, less those of a replacement
    rank 0 that took the state from a live peer (heal)."""
    return sum(1 for s in _our_startups(metrics_file, since)[1:] if not s.get("from_peer"))


def startup_seconds(metrics_file: str, connected: float, since: float | None = None) -> dict[str, float] | None:
    """This session's start-up, from rank 0's first `startup` record written after `since` (default `connected`; a
    restart writes another), in seconds since this process started."""
    began = process_start_time()
    ours = _our_startups(metrics_file, connected if since is None else since)
    if not ours:
        return None
    s = ours[0]
    return {
        "connect": round(connected - began, 3),
        "workers": round(s["worker_entered"] - began, 3),
        "ready": round(s["ready"] - began, 3),
        "first_step": round(s["first_step"] - began, 3),
    }
