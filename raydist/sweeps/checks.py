"""What tune refuses before Ray starts (its registry entry's `check`)."""

from __future__ import annotations

from raydist.config import Config
from raydist.driver.preflight import check_before_ray, local_cpus, ray_address
from raydist.errors import RaydistError, UsageError
from raydist.sweeps import space
from raydist.sweeps.runner import base_config, trial_cpus


def check_tune(cfg: Config) -> None:
    """The space against the trials' base config, the strategy's own checks on that config, and what the embedded
    instance can ever run at once."""
    base = base_config(cfg)
    dims = space.dimensions(base, cfg.tune.space)
    try:
        check_before_ray(cfg.tune.strategy, base, reach=False)
    except RaydistError as e:
        raise type(e)(f"tune: {cfg.tune.strategy}: {e}") from None
    if space.grid_size(dims) * cfg.tune.num_samples > 10_000:
        raise UsageError("tune: the space's grid times tune.num_samples exceeds 10000 trials")
    if ray_address(cfg):
        return  # a cluster's CPUs are known once joined; Tune queues what does not fit
    cpus, need = local_cpus(cfg), trial_cpus(cfg)
    if cfg.tune.max_concurrent and cfg.tune.max_concurrent * need > cpus:
        raise UsageError(
            f"tune.max_concurrent={cfg.tune.max_concurrent} trials need {cfg.tune.max_concurrent * need:g} CPUs "
            f"(scaling.num_workers x scaling.cpus_per_worker each) but the local Ray instance has {cpus:g}; "
            "lower it, or 0: as many as fit"
        )
