"""The long scenarios `make test` leaves out: each one's outcome, stored where the suite checks it.

    .venv/bin/python -m benchmarks.long_tests --out docs/data/long_tests.json
    .venv/bin/python -m benchmarks.long_tests --missing --out docs/data/long_tests.json   # only those not passed there
    .venv/bin/python -m benchmarks.long_tests --report docs/data/long_tests.json

A test marked `long` (pyproject's addopts deselects them) is a chaos run or a full scenario whose short version is in
the suite: a batch job warned, requeued and resumed to identical losses, a node lost mid-run, a rank killed and the
group restarted. They take minutes each, and together they would stretch `make test` past its 15 minutes on 2 cores
(docs/dev/testing.md#long-scenarios). This runs them all with real Ray and real SLURM, as `make test` runs the suite
(two pytest-xdist workers, the SLURM ones in one group; root for the emulated hosts), and stores each test's outcome
and wall time with the machine and the commit (each test's own: `--missing` runs only the scenarios the stored
file has no passing outcome for, a new one or one that failed, and adds them to it). tests/test_long_tests.py fails the suite when a `long` test has no
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


def run_long(report: Path, only: list[str] | None = None) -> tuple[int, float]:
    """pytest -m long in this checkout (`only`: these test ids), JUnit XML on the side: its exit status and wall
    time."""
    t = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-m", "long", "-n", "2", "--dist", "loadgroup"]
    r = subprocess.run([*cmd, "--no-loadscope-reorder", f"--junitxml={report}", *(only or [])], cwd=REPO)
    return r.returncode, round(time.monotonic() - t, 1)


def long_test_ids() -> list[str]:
    """Every test marked long, as pytest names it."""
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "long", "-p", "no:xdist"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("tests/") and "::" in line]


def outcomes(report: Path, commit: str) -> dict[str, dict]:
    """Each test's id (`tests/test_x.py::name[param]`), outcome and wall time, from the JUnit report."""
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        bad = next((x for x in (case.find("failure"), case.find("error")) if x is not None), None)
        outcome = "skipped" if case.find("skipped") is not None else "failed" if bad is not None else "passed"
        name = case.get("name", "")
        if "@" in name and "]" not in name.rsplit("@", 1)[1]:  # xdist's group suffix: the id is pytest's without it
            name = name.rsplit("@", 1)[0]
        found[f"{module}::{name}"] = {
            "outcome": outcome,
            "wall_s": round(float(case.get("time", 0)), 1),
            "commit": commit,
            **({"report": (bad.text or bad.get("message", ""))[-3000:]} if bad is not None else {}),
        }
    return found


def report_line(data: dict) -> str:
    tests = data["tests"]
    passed = sum(t["outcome"] == "passed" for t in tests.values())
    commits = ", ".join(sorted({t["commit"][:7] for t in tests.values()}))
    return (
        f"{len(tests)} long scenarios, {passed} passed, in {data['wall_s']:.0f} s of pytest on "
        f"{data['machine']['cpus']} CPUs (commit {commits}; {data['date']})"
    )


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--out", type=Path, help="where to store the outcomes (docs/data/long_tests.json)")
    ap.add_argument("--missing", action="store_true", help="run only the scenarios --out has no pass for; add them")
    ap.add_argument("--report", type=Path, help="print the stored file's line and exit")
    args = ap.parse_args()
    if args.report:
        print(report_line(json.loads(args.report.read_text())))
        return 0
    if args.missing and not (args.out and args.out.exists()):
        print("long_tests: error: --missing adds to the file --out names, which does not exist", file=sys.stderr)
        return 2
    stored = json.loads(args.out.read_text()) if args.missing else {"tests": {}, "wall_s": 0.0}
    only = [t for t in long_test_ids() if stored["tests"].get(t, {}).get("outcome") != "passed"]
    if args.missing and not only:
        print(report_line(stored))
        return 0
    with tempfile.TemporaryDirectory(prefix="rd-long-") as tmp:
        report = Path(tmp) / "junit.xml"
        header = stamp()
        code, wall = run_long(report, only if args.missing else None)
        if not report.exists():
            print(f"long_tests: error: pytest wrote no report (exit {code})", file=sys.stderr)
            return 1
        tests = {**stored["tests"], **outcomes(report, header["commit"])}
        current = set(long_test_ids())  # a renamed or unmarked scenario's old outcome goes
        data = {
            **header,
            "exit_code": code,
            "wall_s": round(stored["wall_s"] + wall, 1),
            "tests": {t: r for t, r in tests.items() if t in current},
        }
    if args.out:
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(report_line(data))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
