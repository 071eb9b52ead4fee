"""Shared pytest set-up."""

import os
from pathlib import Path

import pytest

# The emulated SLURM cluster lives in tests/support/cluster/ (see emucluster.py); its session fixture is shared here.
# tests.support is importable from the repository root, which pyproject.toml's `pythonpath` puts on sys.path.
from tests.support.cluster.pytest_emucluster import slurm_cluster  # noqa: F401
from tests.support.comparerun import compared  # noqa: F401

SHARED_MODULES = pytest.StashKey[set]()


def _leave_out_the_long_scenarios(config, items) -> None:
    """Tests marked `long` run only where `-m` names them (benchmarks/long_tests.py: `-m long`), whatever else
    selects: `make test PYTEST_ARGS="-m 'not slow'"` or `pytest -m slurm` leave them out too."""
    if "long" in (config.option.markexpr or ""):
        return
    long = [item for item in items if item.get_closest_marker("long")]
    if long:
        config.hook.pytest_deselected(items=long)
        items[:] = [item for item in items if not item.get_closest_marker("long")]


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Under `-n 2` (make test) each module's tests run in one xdist worker, so a module's shared fixtures (a Ray
    head, compare's runs) are built once; every test on the emulated SLURM cluster runs in the same worker, so the
    session builds one cluster (two at once would share the machine's munge and SLURM ports), and every test that
    reads the one compare run (tests/support/comparerun.py) in one worker too, so it runs once.

    The groups go out in this order (the Makefile turns off xdist's own reordering by size): the SLURM group first,
    the longest, then the modules whose tests share a Ray head (tests/support/sharedray.py) one after another, so
    that a worker runs them in a row on one head, then the rest, longest first as the stored suite run timed them
    (`_stored_seconds`), so that the session ends on short tests in both workers: a long module sent out last ran
    alone in one worker for half a minute after the other had ended."""
    _leave_out_the_long_scenarios(config, items)
    groups, shared, slow = {}, set(), set()
    for item in items:
        names = getattr(item, "fixturenames", ())
        group = "slurm" if "slurm_cluster" in names else "compare" if "compared" in names else item.module.__name__
        groups[item.nodeid] = group
        item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("shared_ray") is not None:
            shared.add(item.module.__name__)
        if item.get_closest_marker("slow") is not None:
            slow.add(group)
    config.stash[SHARED_MODULES] = shared
    first = {}
    for index, item in enumerate(items):
        first.setdefault(groups[item.nodeid], index)

    stored, seconds = _stored_seconds(), {}
    for item in items:  # a test the stored run did not time: a guess by its mark
        guess = 10.0 if groups[item.nodeid] in slow else 0.1
        seconds[groups[item.nodeid]] = seconds.get(groups[item.nodeid], 0.0) + stored.get(item.nodeid, guess)

    def order(item) -> tuple[int, float, int]:
        group = groups[item.nodeid]
        if group == "slurm" or group in shared:
            return (0 if group == "slurm" else 1), 0.0, first[group]
        return 2, -seconds[group], first[group]

    items.sort(key=order)  # stable: a group's tests keep their order


def _stored_seconds() -> dict[str, float]:
    """Each test's wall time in the stored suite run (docs/data/suite_time.json, the longest of its rounds), by node
    id; none when there is no such file."""
    import json

    try:
        rounds = json.loads((Path(__file__).parents[1] / "docs" / "data" / "suite_time.json").read_text())["rounds"]
    except (OSError, ValueError, KeyError):
        return {}
    seconds: dict[str, float] = {}
    for r in rounds:
        for name, s in r.get("tests_s", {}).items():  # 'tests.test_x::test_y[...]@group', JUnit's class and name
            module, _, test = name.partition("::")
            node = module.replace(".", "/") + ".py::" + test.rsplit("@", 1)[0]
            seconds[node] = max(seconds.get(node, 0.0), s)
    return seconds


@pytest.fixture(autouse=True)
def _own_environment():
    """Each test starts from the session's environment: raydist.fit, raydist.tune and run_job called in the test's
    process set Ray's settings there (raydist.driver.session.prepare_ray_environment), as they do in a user's, and a
    warm interpreter a later test starts would see a rank's request differ from it (seen in a suite run:
    test_warm_start's ranks started cold after an in-process run_job earlier in the same xdist worker)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _shared_ray(request):
    if request.node.get_closest_marker("shared_ray") is None or os.environ.get("RAYDIST_TESTS_EMBEDDED") == "1":
        yield
        return
    from tests.support import jobutil, sharedray

    jobutil.SHARED_RAY.update(sharedray.job_env())
    try:
        yield
    finally:
        jobutil.SHARED_RAY.clear()


def pytest_runtest_teardown(item, nextitem):
    """The shared head lives while tests that use it run, across modules in a row: an idle head still takes CPU (its
    dashboard, agents and GCS), which the tests beside it, on 2 cores, would pay for the rest of the session, and
    starting one takes about 11 s of CPU (measured, not stored)."""
    if nextitem is None or nextitem.module.__name__ not in item.config.stash[SHARED_MODULES]:
        from tests.support import sharedray

        sharedray.stop()
