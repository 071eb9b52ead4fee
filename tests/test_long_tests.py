"""The long scenarios `make test` leaves out (marked `long`) have each passed in the stored run of
benchmarks/long_tests.py, on a clean commit: a scenario added, renamed or failing cannot land unseen."""

from __future__ import annotations

import json

from tests.support.jobutil import REPO, load_benchmark

STORED = REPO / "docs" / "data" / "long_tests.json"


def _long_test_ids() -> list[str]:
    return load_benchmark("long_tests").long_test_ids()


def test_every_long_scenario_passed_in_the_stored_run_on_a_clean_commit():
    stored = json.loads(STORED.read_text())
    wanted = _long_test_ids()
    assert len(wanted) >= 10, wanted  # the collection itself worked
    missing = [t for t in wanted if stored["tests"].get(t, {}).get("outcome") != "passed"]
    assert not missing, (
        f"{len(missing)} long scenario(s) without a passing stored run: {missing}; "
        "run `python -m benchmarks.long_tests --missing --out docs/data/long_tests.json` on a clean commit"
    )
    dirty = [t for t in wanted if stored["tests"][t]["commit"].endswith("-dirty")]
    assert not dirty, f"run on an uncommitted tree: {dirty}"


def test_this_session_runs_no_long_scenario_unless_its_marker_expression_names_them(request):
    """tests/conftest.py leaves them out of `make test` and of any -m that does not name them."""
    chosen = [item.nodeid for item in request.session.items if item.get_closest_marker("long")]
    named = "long" in (request.config.option.markexpr or "")
    assert named or not chosen, chosen


def test_testing_md_quotes_the_stored_long_run():
    line = load_benchmark("long_tests").report_line(json.loads(STORED.read_text()))
    assert line in (REPO / "docs" / "dev" / "testing.md").read_text(), (
        "docs/dev/testing.md is stale: paste `python -m benchmarks.long_tests --report docs/data/long_tests.json`"
    )
