"""jobs/tune.py's work: a sweep of one strategy with Ray Tune on the job's Ray cluster, then its table, its best
settings as a config file, and a plot of every trial's metric against steps.

The Ray Tune experiment lives in `<run dir>/tune`, each trial's run (its own checkpoints, metrics and summary) in
`<run dir>/trials/<trial id>/`. Running the same command again restores an unfinished sweep (Tune's experiment
restore): finished trials are kept, unfinished ones rerun their job, which resumes from its own checkpoint.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
import time
from pathlib import Path

from raydist import registry
from raydist.config import Config
from raydist.jobconfig import strategy_config
from raydist.sweeps import results, space
from raydist.sweeps.trial import run_trial

EXPERIMENT = "tune"
TRIAL_RETRIES = 1


def trials_dir(cfg: Config) -> Path:
    return Path(cfg.run.run_dir) / "trials"


def base_config(cfg: Config) -> Config:
    """What every trial starts from: the strategy's own defaults and the sections compare shares (model, data,
    train, scaling, ...), from this job's config; the space's values go on top."""
    base = strategy_config(cfg, cfg.tune.strategy, trials_dir(cfg))
    base.run.mlflow, base.run.mlflow_experiment = cfg.run.mlflow, cfg.run.mlflow_experiment
    return base


def trial_cpus(cfg: Config) -> float:
    return cfg.scaling.max_workers * cfg.scaling.cpus_per_worker


def trial_count(cfg: Config) -> int:
    """Ray Tune's count: every point of the space's grid, tune.num_samples times each."""
    return space.grid_size(space.dimensions(base_config(cfg), cfg.tune.space)) * cfg.tune.num_samples


def concurrent(cfg: Config, cluster_cpus: float) -> int:
    """Trials at once: tune.max_concurrent, else as many as the cluster's CPUs hold."""
    fits = int(math.floor(cluster_cpus / trial_cpus(cfg) + 1e-9))
    return cfg.tune.max_concurrent or max(fits, 1)


def scheduler(cfg: Config):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if cfg.tune.scheduler == "fifo":
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr="training_iteration",
        grace_period=cfg.tune.grace_evaluations,
        reduction_factor=cfg.tune.reduction_factor,
        max_t=10**9,
    )


def tuner(cfg: Config, address: str, cluster_cpus: float):
    from ray import tune
    from ray.tune.search import BasicVariantGenerator

    base = base_config(cfg)
    dims = space.dimensions(base, cfg.tune.space)
    trainable = tune.with_resources(
        functools.partial(
            run_trial,
            strategy=cfg.tune.strategy,
            base=base.to_dict(),
            trials_dir=str(trials_dir(cfg)),
            address=address,
            cwd=os.getcwd(),
            # where the driver imports your factories from: its script's directory (sys.path[0]) and here
            pythonpath=os.pathsep.join(dict.fromkeys(p for p in (sys.path[0], os.getcwd()) if p)),
        ),
        # no CPU: the trial's job reserves its workers' CPUs itself (Ray Train or its own actors); Tune needs some resource
        {"CPU": 0, "memory": 2**20},
    )
    path = os.path.join(cfg.run.run_dir, EXPERIMENT)
    if tune.Tuner.can_restore(path):
        print(f"[tune] restoring the sweep in {path}", flush=True)
        return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True)
    return tune.Tuner(
        trainable,
        param_space=space.to_tune(dims),
        tune_config=tune.TuneConfig(
            metric=cfg.tune.metric,
            mode=cfg.tune.mode,
            num_samples=cfg.tune.num_samples,
            scheduler=scheduler(cfg),
            search_alg=BasicVariantGenerator(random_state=cfg.tune.seed, max_concurrent=concurrent(cfg, cluster_cpus)),
        ),
        # A trial whose job failed, or whose actor died with its node, runs once more: its job resumes from its own
        # checkpoint, on the nodes left. The other trials go on.
        run_config=tune.RunConfig(
            name=EXPERIMENT,
            storage_path=cfg.run.run_dir,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=TRIAL_RETRIES),
        ),
    )


def run(cfg: Config, spec: registry.StrategySpec, session) -> results.TuneSummary:
    """The registry's driver for `tune`: Ray is this job's (embedded or joined); each trial's job joins it."""
    import ray

    from raydist.driver.preflight import local_cpus
    from raydist.driver.session import connect, start_local, starts_embedded

    if starts_embedded(cfg):  # ERROR: Ray's start-up lines would come between the sweep's own
        start_local(local_cpus(cfg), logging.ERROR)
        session.ray = "local"
    else:
        session.ray = connect(cfg)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # with verbose=0, Tune's older output says nothing
    address = ray.get_runtime_context().gcs_address
    if session.ray == "local":  # the trials' jobs reach the embedded instance on loopback, where it listens
        address = "127.0.0.1:" + address.rsplit(":", 1)[1]
    cpus = ray.cluster_resources().get("CPU", 0.0)
    n = concurrent(cfg, cpus)
    print(
        f"[tune] {trial_count(cfg)} trial(s) of {cfg.tune.strategy}, {n} at a time, by {cfg.tune.metric} "
        f"({cfg.tune.scheduler}); trials in {trials_dir(cfg)}",
        flush=True,
    )
    # A trial that failed or was left unfinished is a row of the table (its job's one line) and a line of its own
    # log, not a traceback on the sweep's console.
    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    grid = tuner(cfg, address, cpus).fit()
    return results.write(cfg, grid, trials_dir(cfg), session.started or time.perf_counter())
