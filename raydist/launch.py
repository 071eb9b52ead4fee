"""The driver side of every job: parse its command line, connect to Ray, run the strategy's driver, hand over the summary.

    python -m raydist.launch <job> [--config FILE] [--set key=value] ...
jobs/<job>.py are the same entry point with the job's name filled in.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raydist import registry
from raydist.cli import OneLineParser
from raydist.config import Config, job_defaults, load_config
from raydist.errors import RaydistError, UsageError, exits_cleanly
from raydist.atomic import write_json_atomic
from raydist.local_auth import private_auth_token
from raydist.metrics import METRICS_FILE
from raydist.preflight import check_before_ray, check_cluster_fits, check_reachable, local_cpus, ray_address
from raydist.summary import RESULT_ENV, JobSummary


@dataclass
class Session:
    """What a driver needs to know about how its job was started."""

    job: str
    started: float  # time.perf_counter() at the job's start: wall_s counts Ray start-up too
    ray: str = ""  # 'local' or the cluster address, once connected


def parse_job_args(job: str, argv: list[str] | None, doc: str | None = None) -> Config:
    parser = OneLineParser(prog=f"jobs/{job}.py", description=doc)
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML merged over the job's defaults (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides", help="override one key, e.g. --set optim.lr=0.01 (repeatable)")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print Ray Train's per-report and per-checkpoint lines and every report's metrics "
                             "(the same as --set run.verbose=true)")
    args = parser.parse_args(argv)
    cfg = load_config(job_defaults(job), args.config, [*args.overrides, *(["run.verbose=true"] if args.verbose else [])],
                      job=job)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
        sys.exit(0)
    return cfg


def prepare_ray_environment() -> None:
    """Ray settings raydist relies on; each can still be overridden from the environment."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    # Ray Train then records each run, its attempts and workers in its state actor, which the dashboard's Train
    # API (/api/train/v2/runs/v1) reads; off by default in Ray 2.60. Read by the trainer in this process, and by
    # raydist.train_view for the async PS and raydist launch.
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    # Ray Train holds one pending report per worker and drains it on each controller poll (2 s by
    # default), so a report every epoch of a small model would stall training; poll faster instead
    # (at 0.1 s the loop runs at 0.98x the steps/s of plain torchrun, 0.54x at 0.2 s; see benchmarks/).
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    # Without this Ray Train echoes every worker print a second time through its logger.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
    # After a worker hung, Ray Train waits this long for every worker to leave the process group before it
    # kills them (30 s by default); the hung one never answers. Workers started by this process inherit it.
    os.environ.setdefault("TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S", "5")
    # How often each process's metrics reach its node's agent (10 s by default): raydist's metrics (ray_metrics.py)
    # are meant to be watched live. Read by the Ray processes this driver starts (the embedded instance).
    os.environ.setdefault("RAY_metrics_report_interval_ms", "2000")


def connect(cfg: Config) -> str:
    """Join the named cluster (run.address or RAY_ADDRESS), else start a local Ray instance sized for the job."""
    import ray

    address = ray_address(cfg)
    if address:
        check_reachable(address)  # again: run_job's checks may have taken a while
        try:
            # WARNING: Ray's "Connecting to ..." lines would come before a refusal's one line on stderr.
            ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise RaydistError(f"cannot connect to Ray at {address}: {str(e).splitlines()[0]}") from None
        check_cluster_fits(cfg, address)
        return address
    start_local(local_cpus(cfg))
    return "local"


def start_local(num_cpus: int, logging_level: int = logging.INFO, notice=None) -> None:
    """Start the embedded Ray instance: private, loopback only, ending with this process. Its token line goes to
    `notice` (stdout by default; `raydist launch` keeps stdout for the script's own output)."""
    import ray

    token = private_auth_token()
    # The embedded default: a private instance that ends with this process.
    # address="local": a new instance even when /tmp/ray/ray_current_cluster names another (maybe dead) one.
    # Loopback only: nothing outside this machine can reach (or needs) a private instance.
    # Ray's own actors (Ray Train's state actor and placement-group cleaner) find the state API through
    # RAY_API_SERVER_ADDRESS, else by looking for a Ray instance on the machine, which finds the wrong one, or
    # several, when others run beside this one (the dashboard then marks our run aborted). They inherit this
    # process's environment, so name our dashboard before it starts.
    dashboard_port = _free_loopback_port()
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard_port}"
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=True,
             dashboard_host="127.0.0.1", dashboard_port=dashboard_port,
             _node_ip_address="127.0.0.1", runtime_env={"env_vars": {"PYTHONWARNINGS": QUIET_WARNINGS}},
             logging_level=logging_level)
    if token:
        print(f"[raydist] local Ray: token auth on; the dashboard's token is in {token} (readable by this user "
              f"only, removed when the job ends)", file=notice or sys.stdout, flush=True)


QUIET_WARNINGS = "ignore:`ExecutionOptions.exclude_resources` is deprecated"
"""Ray Train's controller trips over Ray Data's own deprecation at every start once state tracking is on: two lines
of Ray's business on the user's console. The embedded instance's processes skip that one warning."""


def _free_loopback_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_error_line(e: BaseException) -> str:
    """The line of a (possibly wrapped) remote error that says what went wrong: the innermost cause's last."""
    cause = e
    while cause.__cause__ is not None:
        cause = cause.__cause__
    lines = [ln for ln in str(cause).splitlines() if ln.strip()]
    return lines[-1] if lines else type(cause).__name__


# ---- strategies that run the shared loop on Ray Train ---------------------------------------------------------


def train_worker(config: dict[str, Any]) -> None:
    """Ray Train's train_loop_per_worker for every loop strategy: the registry names the `Strategy` class."""
    from raydist.context import RayTrainContext
    from raydist.train import Trainer

    entered = time.time()
    cfg = Config.from_dict(config["config"])
    if not cfg.run.verbose:  # Ray Train's "Reporting training result ..." (its log level does not reach that one)
        from raydist.console import quiet_ray_train_logs

        quiet_ray_train_logs()
    strategy = registry.get(config["strategy"]).load("worker")
    ctx = RayTrainContext(async_upload=cfg.checkpoint.async_upload, run_dir=cfg.run.run_dir)
    trainer = Trainer(cfg, ctx, strategy, entered)
    trainer.fit()
    if trainer.aborted and ctx.rank == 0:  # Ray Train keeps metrics only with checkpoints: say it in a file
        write_json_atomic(Path(cfg.run.run_dir) / FAILURE_FILE, {"reason": trainer.aborted})


FAILURE_FILE = "failure.json"
"""Written by rank 0 when the workers ended the run as failed without a checkpoint (a desync, on_desync=stop)."""


ELASTIC_PLACEMENT_RETRIES = 3


def hung_worker(error: BaseException, cfg: Config) -> str | None:
    """'rank R on node H (pid P) stopped answering ...' when Ray Train gave a worker up for not answering its
    health check (a stopped or frozen process), else None. Ray's message holds the worker's repr: read it there."""
    from ray.train.v2._internal.exceptions import WorkerHealthCheckTimeoutError

    failures = getattr(error, "worker_failures", None) or {}
    for rank, failure in sorted(failures.items()):
        if isinstance(failure, WorkerHealthCheckTimeoutError):
            text = str(failure)
            host = re.search(r"hostname='([^']*)'", text)
            pid = re.search(r"pid=(\d+)", text)
            waited = re.search(r"hanging for ([\d.]+) seconds", text)
            return (f"rank {rank} on node {host.group(1) if host else '?'} (pid {pid.group(1) if pid else '?'}) "
                    f"stopped answering for {float(waited.group(1)) if waited else cfg.faults.hang_timeout_s:.0f} s "
                    f"(faults.hang_timeout_s={cfg.faults.hang_timeout_s:g}): a stopped or frozen process")
    return None


def failure_line(error: BaseException, cfg: Config, dead: list[str]) -> str:
    """The one line a failed Ray Train run ends with; a worker group that no longer fits names the dead nodes, a
    worker that stopped answering is named by rank and node."""
    reason = hung_worker(error, cfg) or last_error_line(error)
    if dead and "startup timed out" in reason:
        s = cfg.scaling
        want = f"{s.min_workers} to {s.max_workers}" if s.elastic else str(s.max_workers)
        return (f"training failed: {want} workers no longer fit the cluster after node(s) died: {'; '.join(dead)} "
                f"(waited scaling.node_loss_timeout_s={s.node_loss_timeout_s:g} s; a range such as "
                f"scaling.num_workers={max(1, s.min_workers - 1 if s.elastic else s.max_workers - 1)}-{s.max_workers} "
                f"continues on fewer)")
    return f"training failed: {reason}" + (f"; dead node(s): {'; '.join(dead)}" if dead else "")


def build_trainer(cfg: Config, spec: registry.StrategySpec):
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig

    from raydist.console import ray_train_log_level
    from ray.train.torch import TorchConfig, TorchTrainer

    s = cfg.scaling
    # Read by Ray Train's controller (it propagates these variables): how long placing a worker group may take,
    # how long a worker may leave a health check unanswered (a SIGSTOPped or frozen process answers none; a rank
    # merely waiting in a collective still does, from its actor's own thread), and how long Ray Train's own
    # barriers (report, preemption check) wait.
    os.environ["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(s.node_loss_timeout_s)
    os.environ["RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S"] = str(cfg.faults.hang_timeout_s)
    os.environ["RAY_TRAIN_COLLECTIVE_TIMEOUT_S"] = str(cfg.faults.collective_timeout_s)
    return TorchTrainer(
        train_loop_per_worker=train_worker,
        train_loop_config={"config": cfg.to_dict(), "strategy": spec.name},
        scaling_config=ScalingConfig(
            # A range selects Ray Train's elastic policy: restart from the checkpoint with the workers that fit.
            num_workers=(s.min_workers, s.max_workers) if s.elastic else s.max_workers,
            elastic_resize_monitor_interval_s=s.resize_check_s,
            use_gpu=s.use_gpu,
            resources_per_worker={"CPU": s.cpus_per_worker, **({"GPU": 1} if s.use_gpu else {})},
        ),
        # The process group's timeout bounds its start-up and every gloo collective (NCCL's too, with its
        # watchdog): a peer that is alive but never joins fails the step instead of hanging it.
        torch_config=TorchConfig(backend=cfg.scaling.resolved_backend,
                                 timeout_s=max(1, round(cfg.faults.collective_timeout_s))),
        run_config=RunConfig(
            name=cfg.run.name,
            storage_path=cfg.run.storage_dir,
            checkpoint_config=CheckpointConfig(num_to_keep=cfg.checkpoint.keep),
            # A worker group that cannot be placed again (a lost node) is a controller failure; Ray's default
            # retries those forever. A fixed count gets none: the start timeout (scaling.node_loss_timeout_s) is
            # the bound. An elastic run gets a few, because Ray may still count a lost node as alive (until its
            # heartbeats time out) and first try, in vain, to place as many workers as before.
            failure_config=FailureConfig(max_failures=s.max_failures, max_preemption_failures=s.max_preemptions,
                                         controller_failure_limit=ELASTIC_PLACEMENT_RETRIES if s.elastic else 0),
            # Ray Train's INFO lines (worker group started, checkpoint created, ...) stay in its log files; on the
            # console only with run.verbose.
            logging_config=LoggingConfig(log_level=ray_train_log_level(cfg.run.verbose)),
        ),
    )


def fit_on_ray_train(cfg: Config, spec: registry.StrategySpec, session: Session) -> JobSummary:
    """Run a loop strategy on Ray Train; its summary comes from the final checkpoint's report."""
    from raydist.checkpoint import set_aside_broken_snapshot
    from raydist.cluster_watch import NodeWatcher, dead_nodes
    from raydist.console import MetricsTail, ProgressBar, start_line
    from raydist.ray_metrics import Exporter

    # run_job checked the config (check_before_ray); connect checks what a named cluster can hold.
    session.ray = connect(cfg)
    connected = time.time()
    trainer = build_trainer(cfg, spec)
    moved = set_aside_broken_snapshot(cfg.run.run_dir)  # Ray would refuse to start on a truncated snapshot
    if moved:
        print(moved, flush=True)
    failure = Path(cfg.run.run_dir) / FAILURE_FILE
    failure.unlink(missing_ok=True)  # an earlier session's
    print(start_line(spec.name, cfg.run.run_dir), file=sys.stderr, flush=True)
    bar = ProgressBar(spec.name, export=Exporter(cfg.run.name, spec.name, "driver", 0))
    tail = MetricsTail(os.path.join(cfg.run.run_dir, METRICS_FILE), bar).start()
    completed = False
    try:
        with NodeWatcher():
            result = trainer.fit()
        completed = True
    except Exception as e:  # TrainingFailedError, and the controller's own failures, which arrive as other types
        raise RaydistError(failure_line(e, cfg, dead_nodes())) from None
    finally:
        tail.stop()
        bar.close(completed=completed and not failure.exists())
    if failure.exists():
        raise RaydistError(f"training failed: {json.loads(failure.read_text())['reason']}")
    m = result.metrics or {}
    comm = m.get("comm") or {}
    memory = m.get("memory") or {}
    total = m.get("total_steps")
    return JobSummary(
        strategy=spec.name, run_name=cfg.run.name, run_dir=cfg.run.run_dir, ray=session.ray,
        workers=m.get("world_size", cfg.scaling.max_workers),
        status="completed" if total is not None and m.get("step") == total else "stopped",
        steps=m.get("step", 0), total_steps=total if total is not None else 0,
        resumed_from_step=m.get("resumed_from_step"),
        wall_s=round(time.perf_counter() - session.started, 3), train_time_s=m.get("train_time_s"),
        test_accuracy=m.get("test_accuracy"), test_loss=m.get("test_loss"), final_loss=m.get("loss"),
        samples_per_s=m.get("samples_per_s"), steps_per_s=m.get("steps_per_s"),
        checkpoint=result.checkpoint.path if result.checkpoint else None,
        metrics_file=os.path.join(cfg.run.run_dir, "metrics.jsonl"),
        bytes_per_worker=comm.get("bytes_per_worker", []), wait_s_per_worker=comm.get("wait_s_per_worker", []),
        peak_memory_bytes_per_worker=memory.get("peak_memory_bytes_per_worker", []),
        param_bytes_per_worker=memory.get("param_bytes_per_worker", []),
        stop_reason=m.get("stop_reason"),
        startup_s=startup_seconds(os.path.join(cfg.run.run_dir, METRICS_FILE), connected),
    )


def process_start_time() -> float:
    """Wall time this process started (Linux: /proc; elsewhere the time raydist.launch was imported)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, counted after the comm field
        # starttime counts from boot: against CLOCK_BOOTTIME, not /proc/stat's btime (whole seconds).
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return IMPORTED


IMPORTED = time.time()


def startup_seconds(metrics_file: str, connected: float) -> dict[str, float] | None:
    """This session's start-up, from rank 0's first `startup` record written after `connected` (a restart writes
    another), in seconds since this process started."""
    from raydist.metrics import startup_records

    began = process_start_time()
    try:
        ours = [s for s in startup_records(metrics_file) if s["worker_entered"] >= connected]
    except (OSError, ValueError, KeyError):
        return None
    if not ours:
        return None
    s = ours[0]
    return {"connect": round(connected - began, 3), "workers": round(s["worker_entered"] - began, 3),
            "ready": round(s["ready"] - began, 3), "first_step": round(s["first_step"] - began, 3)}


# ---- every job ------------------------------------------------------------------------------------------------


def run_job(job: str, cfg: Config, started: float | None = None) -> Any:
    """Run `job` (a registry name) on `cfg`; writes its summary.json and returns the summary."""
    check_before_ray(job, cfg)
    prepare_ray_environment()
    session = Session(job=job, started=time.perf_counter() if started is None else started)
    spec = registry.get(job)
    summary = spec.load("driver")(cfg, spec, session)
    summary.write()
    if os.environ.get(RESULT_ENV):
        write_json_atomic(Path(os.environ[RESULT_ENV]), summary.to_dict())
    return summary


@exits_cleanly
def job_main(job: str, argv: list[str] | None = None, doc: str | None = None) -> int:
    started = time.perf_counter()
    if job not in registry.jobs():
        raise UsageError(f"unknown job {job!r} (choose from {', '.join(registry.jobs())})")
    cfg = parse_job_args(job, argv, doc or registry.get(job).summary)
    summary = run_job(job, cfg, started)
    print(json.dumps(summary.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        from raydist.errors import fail

        fail(f"usage: python -m raydist.launch JOB [--config FILE] [--set KEY=VALUE]... (JOB: {', '.join(registry.jobs())})")
    sys.exit(job_main(sys.argv[1], sys.argv[2:]))
