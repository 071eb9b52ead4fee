"""Each job's own checks before Ray starts (its registry entry's `check`): a refusal is one line and exit 2, and
nothing is written. `raydist.launch.check_before_ray` runs the checks every job shares (storage, address, GPUs of
the embedded instance), then these.
"""

from __future__ import annotations

import os

from raydist.config import Config
from raydist.errors import ConfigError, RaydistError, UsageError


GiB = 2**30


def _splits(cfg: Config):
    """The data set, once its size is known to fit in memory (the driver loads it too)."""
    check_data_memory(cfg)
    from raydist.data import load_splits

    return load_splits(cfg.data)


def check_loop(cfg: Config, data=None) -> int:
    """The loop strategies (sync, local SGD): the data and model fit in memory, and every worker's shard fills at
    least one step. Returns the model's parameter count."""
    data = data or _splits(cfg)
    from raydist.sharding import check_fits

    check_fits(cfg, len(data.train))  # a bad batch size is exit 2 here, not a failed worker later
    num_params = count_parameters(cfg, data)
    check_model_memory(cfg, num_params)
    return num_params


def count_parameters(cfg: Config, data) -> int:
    """The model's parameter count, without allocating it (built on torch's meta device)."""
    import torch

    from raydist.models import build_model

    with torch.device("meta"):
        return sum(p.numel() for p in build_model(cfg.model, data).parameters())


def _memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _copies(cfg: Config) -> tuple[int, str]:
    """How many processes on this machine hold the data set and the model: the driver, and on the embedded
    instance each worker too."""
    from raydist.launch import ray_address

    if ray_address(cfg):
        return 1, "the driver"
    return 1 + cfg.scaling.max_workers, f"the driver and {cfg.scaling.max_workers} local workers"


def check_data_memory(cfg: Config) -> None:
    """A synthetic data set larger than this machine's memory (a lower bound: the float64 samples generated)."""
    d = cfg.data
    if d.name != "synthetic":
        return
    per_copy = d.synthetic_samples * d.synthetic_features * 8
    copies, who = _copies(cfg)
    if per_copy * copies > _memory():
        raise ConfigError(f"data.synthetic_samples={d.synthetic_samples} x data.synthetic_features="
                          f"{d.synthetic_features} needs at least {per_copy / GiB:.1f} GiB per copy ({who} each load "
                          f"it) but this machine has {_memory() / GiB:.1f} GiB")


def check_model_memory(cfg: Config, num_params: int) -> None:
    """A model larger than this machine's memory (a lower bound: fp32 weights and gradients in every copy)."""
    per_copy = num_params * 8
    copies, who = _copies(cfg)
    if per_copy * copies > _memory():
        raise ConfigError(f"model.name={cfg.model.name} (model.hidden={cfg.model.hidden}, model.depth="
                          f"{cfg.model.depth}) has {num_params} parameters, at least {per_copy / GiB:.1f} GiB per copy "
                          f"({who} each hold one) but this machine has {_memory() / GiB:.1f} GiB")


def check_async(cfg: Config, data=None) -> None:
    """The async PS: a fixed worker count, one micro-step per step, a batch every shard fills, at most one server
    per parameter, and (on the embedded instance) the CPUs its workers and servers reserve."""
    from raydist.launch import local_cpus, ray_address

    s, ps = cfg.scaling, cfg.async_ps
    if s.elastic:
        raise ConfigError(f"scaling.num_workers={s.num_workers}: the async PS runs a fixed number of workers; give "
                          f"one count")
    if cfg.train.grad_accum != 1:
        raise ConfigError("train.grad_accum: the async PS pushes every batch's gradient as it comes; set it to 1")
    num_params = check_loop(cfg, data)
    if ps.num_servers > num_params:
        raise ConfigError(f"async_ps.num_servers={ps.num_servers} exceeds the model's {num_params} parameters")
    if not ray_address(cfg):  # a named cluster's CPUs are known once joined (AsyncPSRun._check_resources)
        need = s.max_workers * s.cpus_per_worker + ps.num_servers * ps.cpus_per_server
        if need > local_cpus(cfg):
            raise UsageError(
                f"the async job needs {need:g} CPUs (scaling.num_workers x scaling.cpus_per_worker + "
                f"async_ps.num_servers x async_ps.cpus_per_server) but the local Ray instance has {local_cpus(cfg)}")


def check_compare(cfg: Config) -> None:
    """compare: its output directory, then every strategy's own checks on the config its job will get, so that a
    setting one strategy refuses is refused before the first one runs."""
    from raydist.compare import output_dir, strategy_config
    from raydist.launch import check_before_ray, check_writable

    out = output_dir(cfg)
    check_writable(str(out), "compare.output_dir" if cfg.compare.output_dir else "run.storage_path")
    for name in cfg.compare.strategy_list:
        try:
            check_before_ray(name, strategy_config(cfg, name, out / "runs"), reach=False)
        except RaydistError as e:
            raise type(e)(f"{name}: {e}") from None
