"""What the heal strategy refuses before Ray starts (its registry entry's `check`)."""

from __future__ import annotations

import importlib.util

from raydist.config import Config
from raydist.errors import ConfigError, UsageError
from raydist.preflight import check_loop


def check_heal(cfg: Config, data=None) -> None:
    """torchft importable, and at least two workers in a fixed count: healing replaces one while another goes on."""
    if importlib.util.find_spec("torchft") is None:
        raise UsageError("the heal strategy needs torchft: pip install torchft (or use sync, which restarts from "
                         "checkpoints)")
    s = cfg.scaling
    if s.elastic:
        raise ConfigError(f"scaling.num_workers={s.num_workers}: heal replaces failed workers in a fixed count; "
                          f"give one count (Ray Train's torchft backend does not resize)")
    if s.max_workers < 2:
        raise ConfigError(f"scaling.num_workers={s.num_workers}: heal needs 2 or more workers (one goes on while "
                          f"another is replaced); with one, use sync")
    check_loop(cfg, data)
