"""The driver's Ray session: the settings raydist relies on, and joining a cluster or starting the embedded instance.

Every driver uses it: the Ray Train driver (raydist.engines.raytrain), the async PS's driver and `raydist launch`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

from raydist.cluster.listen_port import free_port
from raydist.cluster.local_auth import private_auth_token
from raydist.config import Config
from raydist.driver.preflight import check_cluster_fits, check_reachable, local_cpus, ray_address
from raydist.errors import RaydistError


@dataclass
class Session:
    """What a driver needs to know about how its job was started."""

    job: str
    started: float  # time.perf_counter() at the job's start: wall_s counts Ray start-up too
    ray: str = ""  # 'local' or the cluster address, once connected


def prepare_ray_environment() -> None:
    """Ray settings raydist relies on; each can still be overridden from the environment."""
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    # Ray Train then records each run, its attempts and workers in its state actor, which the dashboard's Train
    # API (/api/train/v2/runs/v1) reads; off by default in Ray 2.60. Read by the trainer in this process, and by
    # raydist.driver.train_view for the async PS and raydist launch.
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
    # The driver echoes what Ray's processes write to their logs; the head's GCS errors (a metrics agent it could
    # not reach while the machine was loaded) would land among the job's lines, after a refusal's one line. They are
    # the cluster's, not the job's: they stay in the head's gcs_server.err. Read when this process imports Ray.
    os.environ.setdefault("RAY_DEDUP_LOGS_SKIP_REGEX", HEAD_LOG_LINE)
    # Ray starts its workers at niceness 15, and so the training workers: a script saw another priority than under
    # torchrun or srun, and any process at normal priority beside it preempted it
    # (docs/dev/decisions/workers-at-the-callers-priority.md). Read by the raylet this process starts (the embedded
    # instance); Ray's daemons that can wait yield instead (raydist.driver.yielding).
    os.environ.setdefault("RAY_worker_niceness", "0")


HEAD_LOG_LINE = r"^\[[^]]*\] \(gcs_server\) "
"""A line of the head's gcs_server.err as Ray's log monitor sends it to a driver ("[time E pid tid] (gcs_server) ...")."""


def starts_embedded(cfg: Config) -> bool:
    """Whether `connect` will start the embedded instance (not imported Ray: it cannot have been started)."""
    ray = sys.modules.get("ray")
    return not ray_address(cfg) and not (ray is not None and ray.is_initialized())


def connect(cfg: Config) -> str:
    """Join the named cluster (run.address or RAY_ADDRESS), else start a local Ray instance sized for the job."""
    import ray

    if ray.is_initialized():  # raydist.fit from a program that has joined a cluster (or started Ray) itself
        return ray.get_runtime_context().gcs_address
    address = ray_address(cfg)
    if address:
        check_reachable(address)  # again: run_job's checks may have taken a while
        from raydist.warm.client import for_cluster_job

        runtime_env = for_cluster_job() if _warm_ray_workers(cfg) else {}
        try:
            # WARNING: Ray's "Connecting to ..." lines would come before a refusal's one line on stderr.
            ray.init(
                address=address, log_to_driver=True, logging_level=logging.WARNING, runtime_env=runtime_env or None
            )
        except (ConnectionError, ValueError, RuntimeError) as e:
            # Ray's ConnectionError names only the address; what went wrong is in the error it chains.
            why = "; ".join(
                str(x).strip().splitlines()[0] for x in (e, e.__cause__) if x is not None and str(x).strip()
            )
            raise RaydistError(f"cannot connect to Ray at {address}: {why}") from None
        check_cluster_fits(cfg, address)
        return address
    start_local(local_cpus(cfg), warm=_warm_ray_workers(cfg))
    return "local"


def _warm_ray_workers(cfg: Config) -> bool:
    """Whether the job's Ray workers are forked by a warm interpreter: not on the launch engine, whose training
    processes are not Ray's (its agents fork them on a SLURM cluster; locally they start before Ray)."""
    return cfg.scaling.warm_python and cfg.scaling.engine != "launch"


def start_local(num_cpus: int, logging_level: int = logging.INFO, notice=None, warm: bool = False) -> None:
    """Start the embedded Ray instance: private, loopback only, ending with this process. Its token line goes to
    `notice` (stdout by default; `raydist launch` keeps stdout for the script's own output). With `warm`, its
    Ray workers are forked from a warm interpreter started beside it (raydist.warm.client)."""
    import ray

    token = private_auth_token()
    # The embedded default: a private instance that ends with this process.
    # address="local": a new instance even when /tmp/ray/ray_current_cluster names another (maybe dead) one.
    # Loopback only: nothing outside this machine can reach (or needs) a private instance.
    # Ray's own actors (Ray Train's state actor and placement-group cleaner) find the state API through
    # RAY_API_SERVER_ADDRESS, else by looking for a Ray instance on the machine, which finds the wrong one, or
    # several, when others run beside this one (the dashboard then marks our run aborted). They inherit this
    # process's environment, so name our dashboard before it starts.
    dashboard_port = free_port("127.0.0.1")
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{dashboard_port}"
    # Ray Train's PreemptionWatcher turns a node drain into get_preemption_info(); nothing drains the one node of
    # an embedded instance (raydist never drains a head; its stop key covers a single node), so the watcher would
    # only be one more Ray process to start on the path to the first step (Ray Train reads this at fit()).
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    # RUST_LOG: torchft's lighthouse logs every quorum at its default level.
    env = {"PYTHONWARNINGS": QUIET_WARNINGS, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
    from raydist.warm.client import NO_PRESTART, start_for_embedded
    from raydist.warm.ray_python import starting_ray_with

    # What ray.init would set (to 1) before it starts the instance's processes, set first so that the warm
    # interpreter has it too; a private loopback instance reports no usage.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if warm:
        for key, value in NO_PRESTART.items():
            os.environ.setdefault(key, value)
    fields, interpreter = start_for_embedded(env, token=bool(token)) if warm else ({}, None)
    with starting_ray_with(interpreter):
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=True,
            dashboard_host="127.0.0.1",
            dashboard_port=dashboard_port,
            _node_ip_address="127.0.0.1",
            runtime_env={"env_vars": env, **fields},
            logging_level=logging_level,
        )
    from raydist.driver import yielding

    yielding.start()
    if token:
        print(
            f"[raydist] local Ray: token auth on; the dashboard's token is in {token} (readable by this user "
            f"only, removed when the job ends)",
            file=notice or sys.stdout,
            flush=True,
        )


DEPRECATION_SKIPPED = "`ExecutionOptions.exclude_resources` is deprecated"
QUIET_WARNINGS = f"ignore:{DEPRECATION_SKIPPED}"
"""Ray Train's controller trips over Ray Data's own deprecation at every start once state tracking is on: two lines
of Ray's business on the user's console. The embedded instance's processes skip that one warning."""


def process_start_time() -> float:
    """Wall time this process started (Linux: /proc; elsewhere the time raydist.driver.session was imported)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, counted after the comm field
        # starttime counts from boot: against CLOCK_BOOTTIME, not /proc/stat's btime (whole seconds).
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return IMPORTED


IMPORTED = time.time()
