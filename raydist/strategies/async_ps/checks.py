"""What the async PS refuses before Ray starts (its registry entry's `check`)."""

from __future__ import annotations

from raydist.config import Config
from raydist.driver.preflight import check_loop, local_cpus, ray_address
from raydist.errors import ConfigError, UsageError


def check_async(cfg: Config, data=None) -> None:
    """The async PS: a fixed worker count, one micro-step per step, a batch every shard fills, at most one server
    per parameter, and (on the embedded instance) the CPUs its workers and servers reserve."""

    s, ps = cfg.scaling, cfg.async_ps
    if s.elastic:
        raise ConfigError(
            f"scaling.num_workers={s.num_workers}: the async PS runs a fixed number of workers; give one count"
        )
    if cfg.train.grad_accum != 1:
        raise ConfigError("train.grad_accum: the async PS pushes every batch's gradient as it comes; set it to 1")
    num_params = check_loop(cfg, data)
    if ps.num_servers > num_params:
        raise ConfigError(f"async_ps.num_servers={ps.num_servers} exceeds the model's {num_params} parameters")
    if not ray_address(cfg):  # a named cluster's CPUs are known once joined (crew_start.check_resources)
        need = s.max_workers * s.cpus_per_worker + ps.num_servers * ps.cpus_per_server
        if need > local_cpus(cfg):
            raise UsageError(
                f"the async job needs {need:g} CPUs (scaling.num_workers x scaling.cpus_per_worker + "
                f"async_ps.num_servers x async_ps.cpus_per_server) but the local Ray instance has {local_cpus(cfg)}"
            )
