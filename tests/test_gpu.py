"""The GPU paths: NCCL, bf16 autocast, CUDA tensors in checkpoints and collectives. Skipped where torch sees no
GPU (CI, the 2-core machines); run on a machine with one: `.venv/bin/python -m pytest tests/test_gpu.py`
(docs/dev/testing.md). A user's own model (examples/tinygpt) on every strategy with one GPU worker, a resume at the exact
step, a user's NCCL script under `raydist launch`, and the refusal of more GPU workers than the machine has."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from raydist import registry
from tests.support.jobutil import REPO, clean_env, summary, tinygpt_job

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU that torch can use")

GPU = ["scaling.use_gpu=true", "scaling.num_workers=1", "train.max_steps=120", "train.report_every_s=0.5"]


def job(name: str, storage, *overrides: str) -> subprocess.CompletedProcess:
    return tinygpt_job(name, *GPU, f"run.storage_path={storage}", *overrides)


@pytest.mark.parametrize("strategy", registry.names())
def test_your_model_trains_on_one_gpu_with_every_strategy(tmp_path, strategy):
    proc = job(strategy, tmp_path)
    s = summary(proc)
    assert s["status"] == "completed" and s["steps"] >= 120, s
    assert s["test_accuracy"] > 2 / 64, s  # per-token accuracy, twice chance
    # on a GPU the loop strategies report torch.cuda.max_memory_allocated: this model needs a few MiB there, where
    # the CPU figure (the process's resident set, torch and Ray included) is hundreds
    assert all(0 < b < 256 * 2**20 for b in s["peak_memory_bytes_per_worker"]), s["peak_memory_bytes_per_worker"]
    if strategy == "heal":  # one worker has no peer to heal from: said in one line, trained as sync
        assert "training with sync" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_a_gpu_run_resumes_at_the_exact_step(tmp_path):
    stopped = summary(job("sync", tmp_path, "train.stop_at_step=40"))
    assert stopped["status"] == "stopped" and stopped["steps"] == 40, stopped
    resumed = summary(job("sync", tmp_path))
    assert resumed["resumed_from_step"] == 40 and resumed["status"] == "completed", resumed
    assert resumed["test_accuracy"] > 2 / 64, resumed


def test_a_users_nccl_script_runs_unmodified_under_raydist_launch(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "raydist.cli",
            "launch",
            "--workers",
            "1",
            "--gpu",
            "--storage",
            str(tmp_path),
            "--",
            sys.executable,
            "examples/ddp_train.py",
            "--epochs",
            "1",
        ],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "checksum" in proc.stdout, proc.stdout[-2000:]


def test_more_gpu_workers_than_the_machine_has_are_refused_in_one_line():
    n = torch.cuda.device_count() + 1
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "sync.py"),
            "--set",
            "scaling.use_gpu=true",
            "--set",
            f"scaling.num_workers={n}",
        ],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    assert f"needs {n} GPU(s) but this machine has {n - 1}" in lines[0], lines[0]
