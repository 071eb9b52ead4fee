"""The long scenarios `make test` leaves out (marked `long`) have each passed in the stored run of
benchmarks/long_tests.py, on a clean commit: a scenario added, renamed or failing cannot land unseen."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.jobutil import REPO, load_benchmark

STORED = REPO / "docs" / "data" / "long_tests.json"


def _collected(*args: str) -> list[str]:
    """The test ids pytest collects here, as `make test` would with `args` added."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *args]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("tests/") and "::" in line]


def _long_test_ids() -> list[str]:
    return _collected("-m", "long")


def test_every_long_scenario_passed_in_the_stored_run_on_a_clean_commit():
    stored = json.loads(STORED.read_text())
    wanted = _long_test_ids()
    assert len(wanted) >= 10, wanted  # the collection itself worked
    missing = [t for t in wanted if stored["tests"].get(t, {}).get("outcome") != "passed"]
    assert not missing, (
        f"{len(missing)} long scenario(s) without a passing stored run: {missing}; "
        "run `python -m benchmarks.long_tests --out docs/data/long_tests.json` on a clean commit"
    )
    dirty = [t for t in wanted if stored["tests"][t]["commit"].endswith("-dirty")]
    assert not dirty, f"run on an uncommitted tree: {dirty}"


def test_the_suite_leaves_the_long_scenarios_out():
    collected = set(_collected())
    assert collected and not collected & set(_long_test_ids())


def test_testing_md_quotes_the_stored_long_run():
    line = load_benchmark("long_tests").report_line(json.loads(STORED.read_text()))
    assert line in (REPO / "docs" / "testing.md").read_text(), (
        "docs/testing.md is stale: paste `python -m benchmarks.long_tests --report docs/data/long_tests.json`"
    )
