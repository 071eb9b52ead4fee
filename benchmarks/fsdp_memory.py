"""FSDP's memory against sync DDP's, as docs/strategies.md quotes it: 2 workers, a 12.7M-parameter MLP (51 MB of
float32 parameters, AdamW), 20 steps, with glibc's default malloc and with MALLOC_MMAP_THRESHOLD_=65536; and the
default small MLP under sync, for what a worker process holds before any model of size.

    .venv/bin/python -m benchmarks.fsdp_memory [--rounds 2]
    .venv/bin/python -m benchmarks.fsdp_memory --rounds 2 --out docs/data/fsdp_memory.json
    .venv/bin/python -m benchmarks.fsdp_memory --report docs/data/fsdp_memory.json      # the docs' table

Every figure comes from the jobs' own summary.json (param_bytes_per_worker, peak_memory_bytes_per_worker: the
process's peak resident set on CPU, bytes_per_worker). Rounds are interleaved: each runs every case once.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks import stored as stored_file
from tests.support.jobutil import clean_env

REPO = Path(__file__).resolve().parents[1]

BIG = ["model.hidden=2048", "model.depth=4"]
COMMON = ["scaling.num_workers=2", "train.max_steps=20"]
MMAP = {"MALLOC_MMAP_THRESHOLD_": "65536"}
# case: (strategy, overrides, extra environment)
CASES = {
    "sync": ("sync", BIG, {}),
    "sync_mmap": ("sync", BIG, MMAP),
    "fsdp": ("fsdp", BIG, {}),
    "fsdp_mmap": ("fsdp", BIG, MMAP),
    "sync_small": ("sync", [], {}),
}
KEEP = ("param_bytes_per_worker", "peak_memory_bytes_per_worker", "bytes_per_worker", "test_accuracy", "final_loss")


def run_case(storage: str, name: str, case: str) -> dict:
    strategy, overrides, env = CASES[case]
    args = [sys.executable, str(REPO / "jobs" / f"{strategy}.py")]
    for o in [f"run.storage_path={storage}", f"run.name={name}", *COMMON, *overrides]:
        args += ["--set", o]
    done = subprocess.run(args, cwd=REPO, env=clean_env(**env), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((Path(storage) / name / "summary.json").read_text())
    return {k: summary[k] for k in KEEP}


def _per_worker_mb(runs: list[dict], key: str, unit: float = 1e6, digits: int = 0) -> str:
    """Each worker's median over the rounds; with more than one round, the min-max of all of them."""
    per_rank = [statistics.median(r[key][i] for r in runs) / unit for i in range(len(runs[0][key]))]
    text = ", ".join(f"{v:.{digits}f}" for v in per_rank)
    every = [v / unit for r in runs for v in r[key]]
    return text + ("" if len(runs) == 1 else f" ({min(every):.{digits}f}-{max(every):.{digits}f})")


def table(stored: dict) -> str:
    runs = {case: [r[case] for r in stored["rounds"]] for case in CASES}
    rows = [
        "| | `param_bytes_per_worker` (MB) | `peak_memory_bytes_per_worker` (MB), glibc's default malloc "
        "| the same, `MALLOC_MMAP_THRESHOLD_=65536` | `bytes_per_worker` (GB) |",
        "|---|---|---|---|---|",
    ]
    for case, label in (("sync", "sync DDP"), ("fsdp", "FSDP")):
        rows.append(
            f"| {label} | {_per_worker_mb(runs[case], 'param_bytes_per_worker', digits=2)} "
            f"| {_per_worker_mb(runs[case], 'peak_memory_bytes_per_worker')} "
            f"| {_per_worker_mb(runs[case + '_mmap'], 'peak_memory_bytes_per_worker')} "
            f"| {statistics.median(statistics.mean(r['bytes_per_worker']) for r in runs[case]) / 1e9:.2f} |"
        )
    return "\n".join(rows) + "\n"


def report(stored: dict) -> str:
    """The table docs/strategies.md quotes and the lines under it."""
    runs = {case: [r[case] for r in stored["rounds"]] for case in CASES}
    acc = {case: sorted({round(r["test_accuracy"], 4) for r in runs[case]}) for case in ("sync", "fsdp")}
    small = [v / 1e6 for r in runs["sync_small"] for v in r["peak_memory_bytes_per_worker"]]
    return (
        f"{table(stored)}\n"
        f"Medians of {len(stored['rounds'])} rounds per worker, min-max of all in brackets. Test accuracy: sync "
        f"{', '.join(f'{a:.4f}' for a in acc['sync'])}, FSDP {', '.join(f'{a:.4f}' for a in acc['fsdp'])}. "
        f"A worker of the default small MLP (sync): peak {statistics.median(small):.0f} MB "
        f"({min(small):.0f}-{max(small):.0f}).\n"
    )


def measure(args) -> dict:
    def one_round(storage: str, i: int) -> dict:
        return {case: run_case(storage, f"{case}{i}", case) for case in CASES}

    return {
        "common": COMMON,
        "big_model": BIG,
        "cases": {k: [s, o, e] for k, (s, o, e) in CASES.items()},
        "rounds": stored_file.rounds(args.rounds, "rd-fsdp-memory-", one_round),
    }


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=2)
    stored_file.cli(ap, "docs/data/fsdp_memory.json", report, measure)


if __name__ == "__main__":
    main()
