"""What a Ray Train driver imports right after connecting, imported while the embedded Ray instance starts.

`ray.init` of the embedded instance takes seconds in which the driver's own thread mostly sleeps, polling for the
dashboard and the raylet to come up. Right after it, the driver imports Ray Data's autoscaling coordinator (which
`raytrain.start_autoscaling_coordinator` starts before the controller) and Ray Train's `TorchTrainer`, half a second
on the path to the first step. A thread imports them during `ray.init` instead (docs/benchmarks.md has the before
and after).

Two threads importing the same module at once can meet in a circular import and one of them see it half
initialised. So the modules `ray.init` itself imports on the way that the thread's modules import too are imported
first, in the caller's thread, before the thread starts: from then on the two threads import disjoint sets of
modules (tests/test_architecture.py checks this against the installed Ray).
"""

from __future__ import annotations

import contextlib
import importlib
import threading

RAY_INIT_IMPORTS = ("ray.dashboard.optional_deps", "ray._common.usage.usage_lib", "ray.autoscaler._private.cli_logger",
                    "difflib")
"""What `ray.init` of the embedded instance imports (Ray 2.60) that AFTER_CONNECT imports too."""

AFTER_CONNECT = ("ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator", "ray.train.torch")
"""What the driver imports right after connecting: raytrain.start_autoscaling_coordinator and build_trainer."""


def _import(names: tuple[str, ...]) -> None:
    for name in names:
        with contextlib.suppress(Exception):  # a speed-up only: the driver's own import then fails with its reason
            importlib.import_module(name)


def import_while_ray_starts() -> threading.Thread:
    """Start importing AFTER_CONNECT in a daemon thread; join it once `ray.init` has returned."""
    _import(RAY_INIT_IMPORTS)
    thread = threading.Thread(target=_import, args=(AFTER_CONNECT,), name="raydist-imports", daemon=True)
    thread.start()
    return thread
