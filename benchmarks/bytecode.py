"""What a process pays to import raydist's modules from source against from their bytecode: why `make run` and `make
test` compile them first (the Makefile's `bytecode` step).

    .venv/bin/python -m benchmarks.bytecode --rounds 5 --out docs/data/bytecode.json
    .venv/bin/python -m benchmarks.bytecode --report docs/data/bytecode.json   # docs/dev/testing.md's line

An editable install (`pip install -e .`, as `make setup` does) leaves raydist's modules uncompiled, and where
PYTHONDONTWRITEBYTECODE is set, as on these machines, Python never writes their cache: every process that imports
them compiles them again. This exports HEAD's `raydist/` twice (`git archive`), compiles one copy, and per round
starts fresh interpreters in each copy's directory (so that it is the one imported) with PYTHONDONTWRITEBYTECODE=1,
alternating which copy goes first. Each imports torch and Ray first, untimed, then the raydist modules a training
process imports (IMPORTED), and reports the CPU time of that import alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from benchmarks import stored as stored_file
from benchmarks.stored import spread

REPO = Path(__file__).resolve().parents[1]

IMPORTED = (
    "raydist.job",
    "raydist.cli",
    "raydist.driver.session",
    "raydist.train.loop",
    "raydist.launcher.agent",
    "raydist.strategies",
)
PROBE = (
    "import sys, time, torch, ray, ray.train\n"
    "t = time.process_time()\n"
    f"for name in {IMPORTED!r}:\n"
    "    __import__(name)\n"
    "spent = time.process_time() - t\n"
    "assert sys.modules['raydist'].__file__.startswith(sys.argv[1]), sys.modules['raydist'].__file__\n"
    "print(spent, sum(1 for m in sys.modules if m.startswith('raydist')))\n"
)
SIDES = ("source", "bytecode")


def export(into: Path) -> None:
    archive = subprocess.run(
        ["git", "archive", "--format=tar", "HEAD", "raydist"], cwd=REPO, capture_output=True, check=True
    ).stdout
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(into, filter="data")


def one_import(tree: Path) -> tuple[float, int]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tree)], cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), int(out[1])


def report(stored: dict) -> str:
    runs = stored["rounds"]
    ms = {side: [1000 * s for r in runs for s in r[side]] for side in SIDES}
    ratio = [min(r["bytecode"]) / min(r["source"]) for r in runs]
    return (
        f"importing raydist's {stored['modules']} modules in a fresh process, CPU: from source "
        f"{spread(ms['source'], 0)} ms, from bytecode {spread(ms['bytecode'], 0)} ms; per round, the fastest "
        f"from bytecode is {spread(ratio, 2)} of the fastest from source ({len(runs)} rounds of "
        f"{len(runs[0]['source'])} processes each, {stored.get('machine', {}).get('cpus', '?')} CPUs, "
        f"{stored.get('date', 'today')}, commit {stored['commit'][:7] if 'commit' in stored else 'this tree'})\n"
    )


def measure(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="rd-bytecode-") as tmp:
        trees = {side: Path(tmp, side) for side in SIDES}
        for tree in trees.values():
            export(tree)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "raydist"], cwd=trees["bytecode"], check=True)
        runs, modules = [], 0
        for i in range(args.rounds):
            order = SIDES if i % 2 == 0 else SIDES[::-1]
            row = {side: [] for side in SIDES}
            for _ in range(args.per_round):
                for side in order:
                    spent, modules = one_import(trees[side])
                    row[side].append(round(spent, 4))
            print(json.dumps({"round": i, **row}), flush=True)
            runs.append(row)
        assert not list(trees["source"].rglob("*.pyc")), "the source copy was compiled"
    return {"imported": list(IMPORTED), "modules": modules, "rounds": runs}


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=5)
    ap.add_argument("--per-round", type=int, default=4, help="processes per copy in each round")
    stored_file.cli(ap, "docs/data/bytecode.json", report, measure)


if __name__ == "__main__":
    main()
