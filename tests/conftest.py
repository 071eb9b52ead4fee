"""Shared pytest set-up."""

import os
import sys
from pathlib import Path

# The emulated SLURM cluster lives in tests/cluster/ (see emucluster.py); its session fixture is shared here.
sys.path.insert(0, str(Path(__file__).with_name("cluster")))
from pytest_emucluster import slurm_cluster  # noqa: E402,F401
from comparerun import compared  # noqa: E402,F401


import pytest  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Under `-n 2` (make test) each module's tests run in one xdist worker, so a module's shared fixtures (a Ray
    head, compare's runs) are built once; every test on the emulated SLURM cluster runs in the same worker, so the
    session builds one cluster (two at once would share the machine's munge and SLURM ports), and every test that
    reads the one compare run (tests/comparerun.py) in one worker too, so it runs once."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = "slurm" if "slurm_cluster" in names else "compare" if "compared" in names else item.module.__name__
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True)
def _shared_ray(request):
    if request.node.get_closest_marker("shared_ray") is None or os.environ.get("RAYDIST_TESTS_EMBEDDED") == "1":
        yield
        return
    import jobutil
    import sharedray

    jobutil.SHARED_RAY.update(sharedray.job_env())
    try:
        yield
    finally:
        jobutil.SHARED_RAY.clear()


def pytest_runtest_teardown(item, nextitem):
    """The shared head lives while its module's tests run: an idle head still takes CPU (its dashboard, agents and
    GCS), which the tests beside it, on 2 cores, would pay for the rest of the session."""
    if nextitem is None or nextitem.module is not item.module:
        import sharedray

        sharedray.stop()
