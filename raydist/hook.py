"""The optional one-line hook a launched script may call: `raydist.hook.report(step=i, loss=loss.item())`.

Under `raydist launch` it tells the launcher the rank's step and loss (shown by `raydist top` and `raydist status`,
and counted as progress by the hang check); anywhere else (plain python, torchrun, srun) it does nothing. It
imports nothing beyond the standard library, costs a dictionary update per call and writes a small file at most
every REPORT_EVERY_S.

    try:
        from raydist.hook import report
    except ImportError:  # raydist not installed: the script runs as before
        def report(**_): pass
"""

from __future__ import annotations

import json
import os
import time

STATUS_ENV = "RAYDIST_STATUS_FILE"
REPORT_EVERY_S = 0.5

_path = os.environ.get(STATUS_ENV)
_last = -float("inf")
_values: dict[str, float] = {}


def report(step: int | None = None, loss: float | None = None, **values: float) -> None:
    """Record this rank's latest step and loss (any other numbers too); a no-op outside `raydist launch`."""
    global _last
    if not _path:
        return
    if step is not None:
        _values["step"] = int(step)
    if loss is not None:
        _values["loss"] = float(loss)
    for k, v in values.items():
        _values[k] = float(v)
    now = time.monotonic()
    if now - _last < REPORT_EVERY_S and "first_step_unix" in _values:
        return
    _last = now
    _values.setdefault("first_step_unix", time.time())
    _values["updated_unix"] = time.time()
    tmp = f"{_path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(_values, f)
        os.replace(tmp, _path)
    except OSError:  # the launcher's view is a view: never fail the script
        pass


def active() -> bool:
    """Whether this process runs under `raydist launch` (its reports reach the launcher)."""
    return bool(_path)


def read(path: str) -> dict[str, float]:
    """The latest values a rank reported (the launcher's side); {} before its first report."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}
