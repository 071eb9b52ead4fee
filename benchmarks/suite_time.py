"""How long `make test` takes from a fresh clone: the figure README.md and docs/dev/testing.md quote.

    .venv/bin/python -m benchmarks.suite_time --out docs/data/suite_time.json [--rounds 2]
    .venv/bin/python -m benchmarks.suite_time --report docs/data/suite_time.json    # the quoted line again
    .venv/bin/python -m benchmarks.suite_time --accounting --out ...    # and where the machine's CPU went
    .venv/bin/python -m benchmarks.suite_time --accounting --commit REV --out ...    # an earlier commit, same hour


Clones this checkout's HEAD into a temporary directory and runs `make test` there, as .ci/run does: set-up
included (a new virtual environment), pytest's JUnit XML report on the side. Stores per round the commit it
tested, the wall time of `make test`, pytest's own time and its counts (from the XML report, not from its
output), with the machine. Root is needed for the SLURM tests, as for `make test` itself.

With --accounting, the kernel's process accounting (Debian's `acct`: accton, dump-acct) is on during the run, and
each round stores the CPU seconds of every process that ended meanwhile, summed by command name (Ray names its
workers `ray::<class>`, its dashboard's modules `ray-dashboard-<module>`), and the CPU seconds of each test and
module, their process trees included (benchmarks/cpu_per_test.py, a pytest plugin that gives each xdist worker a
cgroup): where a shorter suite has to cut. Process accounting and the machine's busy time count the whole
machine's processes, so run nothing else meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks.stored import parser, stamp

REPO = Path(__file__).resolve().parents[1]


def one_round(workdir: Path, accounting: bool = False, commit: str = "") -> dict:
    clone = workdir / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    if commit:
        subprocess.run(["git", "checkout", "-q", commit], cwd=clone, check=True)
    tested = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    report = workdir / "junit.xml"
    pacct = workdir / "pacct"
    if accounting:
        pacct.touch()
        subprocess.run(["accton", str(pacct)], check=True, capture_output=True)
    pytest_args, env, per_test = f"--junitxml={report}", dict(os.environ), workdir / "cpu_per_test.jsonl"
    if accounting:  # the plugin alone on the path: every process of the suite inherits PYTHONPATH
        (workdir / "plugin").mkdir()
        shutil.copy(REPO / "benchmarks" / "cpu_per_test.py", workdir / "plugin")
        env.update(
            PYTHONPATH=os.pathsep.join(filter(None, [str(workdir / "plugin"), env.get("PYTHONPATH")])),
            CPU_PER_TEST_OUT=str(per_test),
        )
        pytest_args += " -p cpu_per_test"
    t, busy = time.monotonic(), busy_cpu_s()
    try:
        r = subprocess.run(
            ["make", "test", f"PYTEST_ARGS={pytest_args}"], cwd=clone, capture_output=True, text=True, env=env
        )
    finally:
        wall, busy = time.monotonic() - t, busy_cpu_s() - busy
        if accounting:
            subprocess.run(["accton", "off"], capture_output=True)
            remove_empty_cgroups()
    suites = ET.parse(report).getroot() if report.exists() else None
    counts = {}
    if suites is not None:
        suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        counts["pytest_s"] = round(float(suite.get("time", 0)), 1)
        counts.update(where_the_time_goes(suite))
    if accounting:
        counts["machine_busy_cpu_s"] = round(busy, 1)
        counts["cpu_by_process"] = cpu_by_process(pacct)
        counts.update(cpu_by_test(per_test))
    return {
        "commit": tested,
        "wall_s": round(wall, 1),
        "exit_code": r.returncode,
        **counts,
        "tail": (r.stdout + r.stderr)[-1500:] if r.returncode else "",
    }


def cpu_by_process(pacct: Path, top: int = 40) -> dict:
    """From a process accounting file: the CPU seconds (user and system) of the processes that ended, summed by
    command name, the largest `top` and the rest together, with how many processes each sum covers."""
    out = subprocess.run(["dump-acct", str(pacct)], capture_output=True, text=True, check=True).stdout
    sums: dict[str, list[float]] = {}
    for line in out.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < 5:
            continue
        name, cpu = fields[0], (float(fields[2]) + float(fields[3])) / os.sysconf("SC_CLK_TCK")
        sums.setdefault(name, [0.0, 0])
        sums[name][0] += cpu
        sums[name][1] += 1
    ranked = sorted(sums.items(), key=lambda kv: -kv[1][0])
    rest = ranked[top:]
    table = {name: {"cpu_s": round(c, 1), "processes": n} for name, (c, n) in ranked[:top]}
    table["(the rest)"] = {"cpu_s": round(sum(c for _, (c, _) in rest), 1), "processes": sum(n for _, (_, n) in rest)}
    return {"total_cpu_s": round(sum(c for c, _ in sums.values()), 1), "by_name": table}


def remove_empty_cgroups() -> None:
    """The plugin's cgroups that its workers could not remove as they ended (a test's process still in them then):
    empty now, or left alone (rmdir refuses a cgroup with processes, another suite's running one included)."""
    from benchmarks.cpu_per_test import cgroup_root

    found = cgroup_root()
    for group in found[0].glob("raydist-suite-*") if found else ():
        try:
            group.rmdir()
        except OSError:
            pass


def busy_cpu_s() -> float:
    """The machine's CPU seconds spent outside idle and I/O wait since boot (/proc/stat), all processes and the
    kernel's: what a run took of the machine, whoever ran it."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cpu_by_test(lines: Path) -> dict:
    """From benchmarks/cpu_per_test.py's lines: each test's CPU seconds (its whole process tree), largest first,
    and each module's sum: the CPU a shorter suite has to cut, where wall time also counts the wait for cores."""
    rows = [json.loads(x) for x in lines.read_text().splitlines()] if lines.exists() else []
    modules: dict[str, float] = {}
    for row in rows:
        module = Path(row["id"].split("::")[0]).stem
        modules[module] = modules.get(module, 0.0) + row["cpu_s"]
    return {
        "tests_cpu_s": round(sum(row["cpu_s"] for row in rows), 1),
        "module_cpu_s": {m: round(c, 1) for m, c in sorted(modules.items(), key=lambda kv: -kv[1])},
        "test_cpu_s": {row["id"]: row["cpu_s"] for row in sorted(rows, key=lambda row: -row["cpu_s"])},
        "timeline": timeline(rows),
    }


def timeline(rows: list[dict]) -> list[list]:
    """[test id, its worker's name, start and end in seconds from the first test's start, CPU seconds] in order of
    start: where neither worker kept a core busy (a test's wait, the last worker's tail)."""
    timed = [row for row in rows if "end" in row]
    if not timed:
        return []
    t0 = min(row["end"] - row["wall_s"] for row in timed)
    return [
        [
            row["id"],
            row["worker"].rsplit("-", 1)[-1],
            round(row["end"] - row["wall_s"] - t0, 2),
            round(row["end"] - t0, 2),
            row["cpu_s"],
        ]
        for row in sorted(timed, key=lambda r: r["end"] - r["wall_s"])
    ]


def where_the_time_goes(suite: ET.Element, top: int = 25) -> dict:
    """From the JUnit report: each module's summed test time (the two xdist workers run modules side by side, so
    these add up to about twice pytest's wall time), the slowest tests, every test's time (where to look when the
    suite is to be shortened), and the ones that failed, with the end of each failure's report: the run's own
    output keeps only its tail, where pytest's summary and warnings leave no room for it."""
    cases = [
        (
            c.get("classname", ""),
            c.get("name", ""),
            float(c.get("time", 0)),
            c.find("failure") is not None or c.find("error") is not None,
        )
        for c in suite.iter("testcase")
    ]
    reports = {
        f"{c.get('classname', '')}::{c.get('name', '')}": (bad.text or bad.get("message", ""))[-3000:]
        for c in suite.iter("testcase")
        for bad in (c.find("failure"), c.find("error"))
        if bad is not None
    }
    modules: dict[str, float] = {}
    for cls, _, t, _ in cases:
        module = cls.split(".")[1] if cls.startswith("tests.") else cls.split(".")[0]
        modules[module] = modules.get(module, 0.0) + t
    slowest = sorted(cases, key=lambda c: -c[2])[:top]
    return {
        "module_s": {m: round(t, 1) for m, t in sorted(modules.items(), key=lambda kv: -kv[1])},
        "slowest_s": {f"{c}::{n}": round(t, 1) for c, n, t, _ in slowest},
        "tests_s": {f"{c}::{n}": round(t, 2) for c, n, t, _ in sorted(cases, key=lambda c: -c[2])},
        "failed": [f"{c}::{n}" for c, n, _, bad in cases if bad],
        "failure_reports": reports,
    }


def minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def report(stored: dict) -> str:
    """The line README.md and docs/dev/testing.md quote."""
    rounds = [r for r in stored["rounds"] if r["exit_code"] == 0]
    if not rounds:
        return "no passing round stored"
    walls, pytests = [r["wall_s"] for r in rounds], [r["pytest_s"] for r in rounds]

    def span(v):
        return minutes(v[0]) if len(v) == 1 else f"{minutes(min(v))} to {minutes(max(v))}"

    return (
        f"`make test` from a fresh clone: {span(sorted(walls))} with set-up, {span(sorted(pytests))} of pytest "
        f"({rounds[-1]['tests']} tests; {len(rounds)} round(s) on {stored['machine']['cpus']} CPUs, "
        f"{stored['date']})"
    )


def main() -> int:
    p = parser(__doc__.splitlines()[0], rounds=1)
    p.add_argument("--out", type=Path, default=REPO / "docs" / "data" / "suite_time.json")
    p.add_argument("--report", type=Path, help="print the quoted line of a stored run and exit")
    p.add_argument(
        "--commit",
        default="",
        help="test this commit instead of HEAD (a run before a change, on the "
        "same hour as the run after it; the accounting plugin is this checkout's)",
    )
    p.add_argument(
        "--accounting",
        action="store_true",
        help="store the CPU time of the run's processes by name (process accounting: needs root and Debian's acct)",
    )
    a = p.parse_args()
    if a.report:
        print(report(json.loads(a.report.read_text())))
        return 0
    if a.accounting and not (shutil.which("accton") and shutil.which("dump-acct")):
        print(
            "suite_time: error: --accounting needs Debian's acct (accton, dump-acct): apt-get install acct",
            file=sys.stderr,
        )
        return 2
    rounds = []
    for i in range(a.rounds):
        with tempfile.TemporaryDirectory(prefix="rd-suite-") as d:
            rounds.append(one_round(Path(d), a.accounting, a.commit))
        print(f"round {i + 1}: {json.dumps({k: v for k, v in rounds[-1].items() if k != 'tail'})}", flush=True)
    stored = {"rounds": rounds, **stamp()}
    a.out.write_text(json.dumps(stored, indent=1) + "\n")
    print(report(stored))
    return 0 if all(r["exit_code"] == 0 for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
