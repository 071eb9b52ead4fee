"""pytest plugin for `suite_time.py --accounting`: the CPU time of each test, its whole process tree included.

Each pytest process (each xdist worker) moves itself into a cgroup of its own at start; every process a test starts
stays in it whatever becomes of its parent (Ray's daemons, SLURM's job steps on the emulated hosts, a warm
interpreter's forks), so the cgroup's CPU counter read before and after a test is that test's CPU time. What a
test leaves running is counted to the next test of the same worker. Needs root and a cgroup hierarchy with CPU
accounting (v1 `cpuacct` or v2); without one the plugin records nothing and says so once.

One JSON line per test goes to $CPU_PER_TEST_OUT (nodeid, worker, CPU and wall seconds). Not a RAYDIST_ name:
the variable reaches every process of the suite, and test_launch asserts that no RAYDIST_ variable reaches a rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

OUT_ENV = "CPU_PER_TEST_OUT"
_counter: Path | None = None


def cgroup_root() -> tuple[Path, str] | None:
    """Where a new cgroup with CPU accounting can be made, and its counter file: v1's cpuacct (nanoseconds) or
    the v2 hierarchy (cpu.stat's usage_usec)."""
    v1 = Path("/sys/fs/cgroup/cpuacct")
    if (v1 / "cpuacct.usage").exists():
        return v1, "cpuacct.usage"
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2" and (Path(fields[1]) / "cpu.stat").exists():
            return Path(fields[1]), "cpu.stat"
    return None


def cpu_seconds(counter: Path) -> float:
    text = counter.read_text()
    if counter.name == "cpuacct.usage":
        return int(text) / 1e9
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("usage_usec")) / 1e6


def pytest_configure(config):
    global _counter
    if not os.environ.get(OUT_ENV):
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    found = cgroup_root()
    try:
        if found is None:
            raise OSError("no cgroup hierarchy with CPU accounting")
        root, name = found
        group = root / f"raydist-suite-{os.getppid()}-{worker}"
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
        _counter = group / name
    except OSError as e:
        print(f"cpu_per_test: not counting ({e})", file=sys.stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _counter is None:
        yield
        return
    cpu, wall = cpu_seconds(_counter), time.monotonic()
    yield
    cpu, wall = cpu_seconds(_counter) - cpu, time.monotonic() - wall
    # end: when the test ended (epoch seconds), so that the workers' timelines show where a core sat idle
    line = json.dumps(
        {
            "id": item.nodeid,
            "worker": _counter.parent.name,
            "cpu_s": round(cpu, 2),
            "wall_s": round(wall, 2),
            "end": round(time.time(), 2),
        }
    )
    with open(os.environ[OUT_ENV], "a") as f:
        f.write(line + "\n")


def pytest_unconfigure(config):
    """Back to the parent cgroup, and this one removed if nothing of the tests is left in it."""
    if _counter is None:
        return
    try:
        (_counter.parent.parent / "cgroup.procs").write_text(str(os.getpid()))
        _counter.parent.rmdir()
    except OSError:
        pass
