"""Where the heal strategy cannot run (its registry entry's `unfit`: the job then runs as sync, after one line
saying why), and what it checks before Ray starts (its `check`)."""

from __future__ import annotations

import importlib.util

from raydist.config import Config
from raydist.driver.preflight import check_loop

# Ray Train's torchft backend (Ray 2.60); an older Ray has none.
from raydist.private_api import TORCHFT_MODULE as _RAY_TORCHFT  # noqa: E402


def why_not_heal(cfg: Config) -> str | None:
    """Why healing cannot work on this install or config, or None: torchft and Ray Train's torchft backend
    importable, and two or more workers (one goes on while another is replaced)."""
    if importlib.util.find_spec("torchft") is None:
        return "torchft is not installed (pip install 'raydist[heal]')"
    if _find(_RAY_TORCHFT) is None:
        return "this Ray has no torchft backend for Ray Train (Ray 2.60 has)"
    s = cfg.scaling
    if s.max_workers < 2:
        return f"scaling.num_workers={s.num_workers}: with one worker there is no peer to heal from"
    return None


def _find(module: str):
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package is missing
        return None


def check_heal(cfg: Config, data=None) -> None:
    """As the loop strategies (it runs only where `why_not_heal` found nothing)."""
    check_loop(cfg, data)
