"""What every benchmark stores beside its raw rounds (docs/data/<name>.json): the machine, the commit, the date.
The figures README and docs/ quote come from these files (tests/test_docs_figures.py keeps the tables equal)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict:
    import ray
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "platform": platform.platform(),
    }


def commit() -> str:
    """HEAD, with '-dirty' when a tracked file that could change a measurement differs from it (docs cannot)."""
    if os.environ.get("RAYDIST_COMMIT"):
        # a copy of the tree (the lent GPU machine, whose .git may be older than the tree): the commit it was copied
        # from, clean, as the caller says
        return os.environ["RAYDIST_COMMIT"] + "-copy"
    r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
    ).stdout.splitlines()
    dirty = [ln for ln in changed if not (ln[3:].startswith("docs/") or ln[3:].endswith(".md"))]
    return r.stdout.strip() + ("-dirty" if dirty else "")


def stamp() -> dict:
    """The machine, the commit, today's date and the load average at the start (a busy machine is slower), for a
    stored result."""
    return {
        "machine": machine(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d"),
        "load_at_start": [round(v, 2) for v in os.getloadavg()],
    }


def spread(values: list[float], digits: int = 1) -> str:
    """'median (min-max)', the way docs/ quote a stored figure."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def parser(description: str, *, rounds: int | None = None) -> argparse.ArgumentParser:
    """A benchmark's argument parser: named as it is run (`python -m benchmarks.<name>`), its docstring as the help,
    and `--rounds` with the benchmark's default where it repeats its measurement."""
    main = sys.modules["__main__"]
    name = getattr(getattr(main, "__spec__", None), "name", None)
    ap = argparse.ArgumentParser(
        prog=f"python -m {name}" if name else None,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if rounds is not None:
        ap.add_argument("--rounds", type=int, default=rounds, help=f"rounds to measure (default {rounds})")
    return ap


def add_options(parser, stored_as: str) -> None:
    """--out and --report, the same in every benchmark whose figures docs/ quote."""
    parser.add_argument("--out", help=f"store the result with the machine and commit ({stored_as})")
    parser.add_argument("--report", metavar="FILE", help="print what the docs quote from a stored file; run nothing")


def print_report(path: str | None, report) -> bool:
    """With --report: print `report(stored)` for the stored file and say so (the caller then runs nothing)."""
    if not path:
        return False
    print(report(json.loads(Path(path).read_text())), end="")
    return True


def save(path: str | None, result: dict, stamped: dict) -> None:
    """With --out: the result with its machine, commit and date (`stamp()`, taken before the run)."""
    if path:
        Path(path).write_text(json.dumps({**result, **stamped}, indent=1) + "\n")


def rounds(n: int, prefix: str, one_round) -> list:
    """`one_round(storage, i)` for i in 0..n-1 in one temporary storage directory, saying on stderr as each ends."""
    done = []
    with tempfile.TemporaryDirectory(prefix=prefix) as storage:
        for i in range(n):
            done.append(one_round(storage, i))
            print(f"round {i + 1}/{n} done", file=sys.stderr, flush=True)
    return done


def cli(parser, stored_as: str, report, measure) -> None:
    """A storing benchmark's main: --report prints `report` of a stored file and runs nothing; otherwise the stamp,
    `measure(args)` (the result dict), its report, and with --out the stored file."""
    add_options(parser, stored_as)
    args = parser.parse_args()
    if print_report(args.report, report):
        return
    stamped = stamp()
    result = measure(args)
    save(args.out, result, stamped)  # before the report: a report that fails must not lose the rounds
    print(report({**result, **stamped}), end="", flush=True)


def busy_cpu_s() -> float:
    """Seconds of CPU the whole machine has spent (all cores; idle and I/O wait excluded): Ray's daemons included."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / 100
