"""The long scenarios `make test` leaves out: each one's outcome, stored where the suite checks it.

    .venv/bin/python -m benchmarks.long_tests --out docs/data/long_tests.json
    .venv/bin/python -m benchmarks.long_tests --report docs/data/long_tests.json

A test marked `long` (pyproject's addopts deselects them) is a chaos run or a full scenario whose short version is in
the suite: a batch job warned, requeued and resumed to identical losses, a node lost mid-run, a rank killed and the
group restarted. They take minutes each, and together they would stretch `make test` past its 15 minutes on 2 cores
(docs/testing.md#long-scenarios). This runs them all with real Ray and real SLURM, as `make test` runs the suite
(two pytest-xdist workers, the SLURM ones in one group; root for the emulated hosts), and stores each test's outcome
and wall time with the machine and the commit. tests/test_long_tests.py fails the suite when a `long` test has no
passing outcome in the stored file: a new or renamed scenario is run here before it lands.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.stored import REPO, parser, stamp


def run_long(report: Path) -> tuple[int, float]:
    """pytest -m long in this checkout, JUnit XML on the side: its exit status and wall time."""
    t = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-m", "long", "-n", "2", "--dist", "loadgroup"]
    r = subprocess.run([*cmd, "--no-loadscope-reorder", f"--junitxml={report}"], cwd=REPO)
    return r.returncode, round(time.monotonic() - t, 1)


def outcomes(report: Path) -> dict[str, dict]:
    """Each test's id (`tests/test_x.py::name[param]`), outcome and wall time, from the JUnit report."""
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        bad = next((x for x in (case.find("failure"), case.find("error")) if x is not None), None)
        outcome = "skipped" if case.find("skipped") is not None else "failed" if bad is not None else "passed"
        found[f"{module}::{case.get('name')}"] = {
            "outcome": outcome,
            "wall_s": round(float(case.get("time", 0)), 1),
            **({"report": (bad.text or bad.get("message", ""))[-3000:]} if bad is not None else {}),
        }
    return found


def report_line(data: dict) -> str:
    tests = data["tests"]
    passed = sum(t["outcome"] == "passed" for t in tests.values())
    return (
        f"{len(tests)} long scenarios, {passed} passed, in {data['wall_s']:.0f} s on {data['machine']['cpus']} CPUs "
        f"({data['commit'][:7]}, {data['date']})"
    )


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", type=Path, help="where to store the outcomes (docs/data/long_tests.json)")
    ap.add_argument("--report", type=Path, help="print the stored file's line and exit")
    args = ap.parse_args()
    if args.report:
        print(report_line(json.loads(args.report.read_text())))
        return 0
    with tempfile.TemporaryDirectory(prefix="rd-long-") as tmp:
        report = Path(tmp) / "junit.xml"
        header = stamp()
        code, wall = run_long(report)
        if not report.exists():
            print(f"long_tests: error: pytest wrote no report (exit {code})", file=sys.stderr)
            return 1
        data = {**header, "exit_code": code, "wall_s": wall, "tests": outcomes(report)}
    if args.out:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(report_line(data))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
