"""Every strategy on one GPU with a user's model (examples/tinygpt, by import path), and what NCCL says to two
ranks on one GPU: the GPU paths measured where a GPU was lent (docs/gpu.md quotes it).

    .venv/bin/python -m benchmarks.gpu_strategies --rounds 2 --out docs/data/gpu_strategies.json
    .venv/bin/python -m benchmarks.gpu_strategies --report docs/data/gpu_strategies.json   # the table for docs/gpu.md

One worker per case (one GPU), 200 steps of tinygpt, rounds interleaved (each round runs every case once). Every
figure comes from the job's own summary.json: steps/s of the training loop, the start-up split (`startup_s`), the
peak GPU memory (torch.cuda.max_memory_allocated) and the test accuracy. sync runs twice: bf16 autocast
(train.mixed_precision=auto on a GPU) and fp32 (off). The NCCL probe starts two processes on cuda:0 and all-reduces
once: NCCL refuses that, which is why the heal strategy needs one GPU per replica (tests/test_gpu.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import stored as stored_file
from tests.support.jobutil import clean_env, tinygpt_job

REPO = Path(__file__).resolve().parents[1]

COMMON = ["scaling.use_gpu=true", "scaling.num_workers=1", "train.max_steps=200", "run.tensorboard=false"]
CASES = {  # case: (strategy, overrides)
    "sync": ("sync", []),
    "sync_fp32": ("sync", ["train.mixed_precision=off"]),
    "fsdp": ("fsdp", []),
    "async": ("async", []),
}
KEEP = ("steps", "steps_per_s", "startup_s", "wall_s", "peak_memory_bytes_per_worker", "test_accuracy")

PROBE = """
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
def rank(r):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=r, world_size=2)
    t = torch.ones(1, device="cuda:0")
    dist.all_reduce(t)
    torch.cuda.synchronize()
if __name__ == "__main__":
    mp.start_processes(rank, nprocs=2, start_method="fork")
"""


def run_case(storage: str, name: str, case: str) -> dict:
    strategy, overrides = CASES[case]
    done = tinygpt_job(strategy, f"run.storage_path={storage}", f"run.name={name}", *COMMON, *overrides)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    summary = json.loads((Path(storage) / name / "summary.json").read_text())
    return {k: summary[k] for k in KEEP}


def nccl_two_ranks_one_gpu() -> str:
    """The last line NCCL's two ranks on cuda:0 print ('ok' if the all-reduce went through)."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=clean_env(NCCL_DEBUG="WARN")
    )
    if done.returncode == 0:
        return "ok"
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if "Duplicate GPU" in ln or "NCCL" in ln]
    return (lines or (done.stdout + done.stderr).strip().splitlines() or ["no output"])[-1][:300]


def gpu() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


def first(rs: list[dict]) -> str:
    """The first step's time from the job's start; '-' for async, whose servers and workers are not a Ray Train run."""
    starts = [r["startup_s"]["first_step"] for r in rs if r["startup_s"]]
    return stored_file.spread(starts) if starts else "-"


def report(stored: dict) -> str:
    runs = {case: [r[case] for r in stored["rounds"]] for case in CASES}
    s = stored_file.spread
    rows = [
        "| case | steps/s | first step after (s) | peak GPU memory (MiB) | test accuracy |",
        "|---|---|---|---|---|",
    ]
    for case, label in (
        ("sync", "sync, bf16 autocast"),
        ("sync_fp32", "sync, fp32"),
        ("fsdp", "fsdp, bf16 autocast"),
        ("async", "async (parameter server)"),
    ):
        rs = runs[case]
        mem = [b / 2**20 for r in rs for b in r["peak_memory_bytes_per_worker"]]
        rows.append(
            f"| {label} | {s([r['steps_per_s'] for r in rs])} | {first(rs)} "
            f"| {s(mem) if mem else '-'} | {s([r['test_accuracy'] for r in rs], 3)} |"
        )
    return (
        "\n".join(rows) + f"\n\n{stored['gpu']}, {len(stored['rounds'])} rounds, median (min-max). NCCL, two "
        f"ranks on one GPU: {stored['nccl_two_ranks_one_gpu']}\n"
    )


def measure(args) -> dict:
    def one_round(storage: str, i: int) -> dict:
        return {case: run_case(storage, f"{case}{i}", case) for case in CASES}

    return {
        "gpu": gpu(),
        "common": COMMON,
        "cases": {k: [s, o] for k, (s, o) in CASES.items()},
        "nccl_two_ranks_one_gpu": nccl_two_ranks_one_gpu(),
        "rounds": stored_file.rounds(args.rounds, "rd-gpu-", one_round),
    }


def main() -> None:
    ap = stored_file.parser(__doc__, rounds=2)
    stored_file.cli(ap, "docs/data/gpu_strategies.json", report, measure)


if __name__ == "__main__":
    main()
