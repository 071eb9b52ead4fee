"""What compare refuses before its first strategy starts (its registry entry's `check`)."""

from __future__ import annotations

from raydist.compare import tuned
from raydist.compare.runner import output_dir
from raydist.config import Config
from raydist.driver.preflight import check_before_ray, check_writable
from raydist.errors import RaydistError
from raydist.jobconfig import strategy_config
from raydist.sweeps.checks import check_tune


def check_compare(cfg: Config) -> None:
    """compare: its output directory, then every strategy's own checks on the config its job will get, so that a
    setting one strategy refuses is refused before the first one runs."""
    out = output_dir(cfg)
    check_writable(str(out), "compare.output_dir" if cfg.compare.output_dir else "run.storage_path")
    for name in cfg.compare.strategy_list:
        try:
            check_before_ray(name, strategy_config(cfg, name, out / "runs"), reach=False)
            if cfg.compare.tune:  # its sweep's space, bounds and trials at once, as jobs/tune.py checks them
                check_tune(tuned.sweep_config(cfg, name, out))
        except RaydistError as e:
            raise type(e)(f"{name}: {e}") from None
