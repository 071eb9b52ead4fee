"""`make setup` on a fresh clone with uv (the Makefile's default) against pip alone (`INSTALLER=pip`): the set-up is
the part of `make test` that keeps one core busy at most, so its seconds count in full (docs/dev/testing.md).

    .venv/bin/python -m benchmarks.setup_time --rounds 3 --out docs/data/setup_time.json
    .venv/bin/python -m benchmarks.setup_time --report docs/data/setup_time.json   # docs/dev/testing.md's line

Each round clones HEAD twice and runs `make setup` in each clone, one installer after the other (which goes first
alternates between rounds), with empty download caches of its own (PIP_CACHE_DIR, UV_CACHE_DIR), as on a fresh CI
machine. It records the wall time and the CPU time of make and everything it started, and checks that the
environment holds torch's bytecode (processes that may not write it, PYTHONDONTWRITEBYTECODE, would otherwise
compile torch at every import).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import stored as stored_file
from benchmarks.stored import spread

REPO = Path(__file__).resolve().parents[1]

INSTALLERS = ("uv", "pip")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_setup(tmp: Path, installer: str, i: int) -> dict:
    """A fresh clone of HEAD and its `make setup`, with caches of its own: seconds, CPU seconds."""
    clone = tmp / f"{installer}-{i}"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    env = {
        **os.environ,
        "PIP_CACHE_DIR": str(tmp / f"pip-cache-{installer}-{i}"),
        "UV_CACHE_DIR": str(tmp / f"uv-cache-{installer}-{i}"),
    }
    env.pop("VIRTUAL_ENV", None)
    cpu, t = children_cpu(), time.perf_counter()
    done = subprocess.run(
        ["make", "setup", f"INSTALLER={installer}"], cwd=clone, env=env, capture_output=True, text=True
    )
    took, spent = time.perf_counter() - t, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"make setup INSTALLER={installer}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    site = next((clone / ".venv" / "lib").glob("python3*/site-packages"))
    compiled = sum(1 for _ in (site / "torch").rglob("*.pyc"))
    assert compiled > 1000, f"{installer}: torch was installed without its bytecode ({compiled} .pyc files)"
    used_uv = (clone / ".venv" / "bin" / "uv").exists()
    assert used_uv == (installer == "uv"), f"INSTALLER={installer} but uv {'was' if used_uv else 'was not'} used"
    for done_with in (clone, env["PIP_CACHE_DIR"], env["UV_CACHE_DIR"]):  # gigabytes each
        shutil.rmtree(done_with, ignore_errors=True)
    return {"s": round(took, 2), "cpu_s": round(spent, 2), "torch_pyc": compiled}


def measure(args) -> dict:
    runs = []
    with tempfile.TemporaryDirectory(prefix="rd-setup-") as tmp:
        for i in range(args.rounds):
            order = INSTALLERS if i % 2 == 0 else INSTALLERS[::-1]
            row = {name: one_setup(Path(tmp), name, i) for name in order}
            print(json.dumps({"round": i, **row}), flush=True)
            runs.append(row)
    return {"rounds": runs}


def report(stored: dict) -> str:
    runs = stored["rounds"]
    took = {name: [r[name]["s"] for r in runs] for name in INSTALLERS}
    cpu = {name: [r[name]["cpu_s"] for r in runs] for name in INSTALLERS}
    ratio = [r["uv"]["s"] / r["pip"]["s"] for r in runs]
    return (
        f"make setup on a fresh clone, empty caches: with uv {spread(took['uv'])} s ({spread(cpu['uv'])} s of "
        f"CPU), with pip alone {spread(took['pip'])} s ({spread(cpu['pip'])} s of CPU); per round uv took "
        f"{spread(ratio, 2)} of pip's time ({len(runs)} rounds, {stored.get('machine', {}).get('cpus', '?')} CPUs, "
        f"{stored.get('date', 'today')}, commit {stored.get('commit', 'this tree')[:7]})\n"
    )


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=3)
    stored_file.cli(ap, "docs/data/setup_time.json", report, measure)


if __name__ == "__main__":
    main()
