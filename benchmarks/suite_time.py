"""How long `make test` takes from a fresh clone: the figure README.md and docs/testing.md quote.

    .venv/bin/python benchmarks/suite_time.py --out docs/data/suite_time.json [--rounds 2]
    .venv/bin/python benchmarks/suite_time.py --report docs/data/suite_time.json    # the quoted line again

Clones this checkout's HEAD into a temporary directory and runs `make test` there, as .ci/run does: set-up
included (a new virtual environment), pytest's JUnit XML report on the side. Stores per round the commit it
tested, the wall time of `make test`, pytest's own time and its counts (from the XML report, not from its
output), with the machine. Root is needed for the SLURM tests, as for `make test` itself.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from stored import stamp  # noqa: E402


def one_round(workdir: Path) -> dict:
    clone = workdir / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    tested = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    report = workdir / "junit.xml"
    t = time.monotonic()
    r = subprocess.run(["make", "test", f"PYTEST_ARGS=--junitxml={report}"], cwd=clone, capture_output=True,
                       text=True)
    wall = time.monotonic() - t
    suites = ET.parse(report).getroot() if report.exists() else None
    counts = {}
    if suites is not None:
        suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        counts["pytest_s"] = round(float(suite.get("time", 0)), 1)
        counts.update(where_the_time_goes(suite))
    return {"commit": tested, "wall_s": round(wall, 1), "exit_code": r.returncode, **counts,
            "tail": (r.stdout + r.stderr)[-1500:] if r.returncode else ""}


def where_the_time_goes(suite: ET.Element, top: int = 25) -> dict:
    """From the JUnit report: each module's summed test time (the two xdist workers run modules side by side, so
    these add up to about twice pytest's wall time), the slowest tests, every test's time (where to look when the
    suite is to be shortened), and the ones that failed."""
    cases = [(c.get("classname", ""), c.get("name", ""), float(c.get("time", 0)),
              c.find("failure") is not None or c.find("error") is not None) for c in suite.iter("testcase")]
    modules: dict[str, float] = {}
    for cls, _, t, _ in cases:
        module = cls.split(".")[1] if cls.startswith("tests.") else cls.split(".")[0]
        modules[module] = modules.get(module, 0.0) + t
    slowest = sorted(cases, key=lambda c: -c[2])[:top]
    return {"module_s": {m: round(t, 1) for m, t in sorted(modules.items(), key=lambda kv: -kv[1])},
            "slowest_s": {f"{c}::{n}": round(t, 1) for c, n, t, _ in slowest},
            "tests_s": {f"{c}::{n}": round(t, 2) for c, n, t, _ in sorted(cases, key=lambda c: -c[2])},
            "failed": [f"{c}::{n}" for c, n, _, bad in cases if bad]}


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def report(stored: dict) -> str:
    """The line README.md and docs/testing.md quote."""
    rounds = [r for r in stored["rounds"] if r["exit_code"] == 0]
    if not rounds:
        return "no passing round stored"
    walls, pytests = [r["wall_s"] for r in rounds], [r["pytest_s"] for r in rounds]
    span = (lambda v: minutes(v[0]) if len(v) == 1 else f"{minutes(min(v))} to {minutes(max(v))}")
    return (f"`make test` from a fresh clone: {span(sorted(walls))} with set-up, {span(sorted(pytests))} of pytest "
            f"({rounds[-1]['tests']} tests; {len(rounds)} round(s) on {stored['machine']['cpus']} CPUs, "
            f"{stored['date']})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", type=Path, default=REPO / "docs" / "data" / "suite_time.json")
    p.add_argument("--report", type=Path, help="print the quoted line of a stored run and exit")
    a = p.parse_args()
    if a.report:
        print(report(json.loads(a.report.read_text())))
        return 0
    rounds = []
    for i in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="rd-suite-") as d:
            rounds.append(one_round(Path(d)))
        print(f"round {i + 1}: {json.dumps({k: v for k, v in rounds[-1].items() if k != 'tail'})}", flush=True)
    stored = {"rounds": rounds, **stamp()}
    a.out.write_text(json.dumps(stored, indent=1) + "\n")
    print(report(stored))
    return 0 if all(r["exit_code"] == 0 for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
