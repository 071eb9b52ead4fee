"""Two raydist clusters on the same SLURM nodes at once: two `sbatch cluster/ray_up.slurm` jobs sharing all three
hosts (a CPU each; the emulated nodes have two). Each gets its own ports, temp dirs and token, one's token does not
open the other, and tearing one down leaves the other running: a run submitted to it afterwards trains."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import rayup

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _wait_gone(cluster, job_id: int, timeout: float = 60) -> dict[str, list[str]]:
    """Job `job_id`'s own traces (its tagged processes, its temp dir) until none are left or the time is up."""
    deadline = time.monotonic() + timeout
    while (left := rayup.job_leftovers(cluster, job_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_two_clusters_on_the_same_nodes_keep_apart_and_one_outlives_the_other(slurm_cluster):
    slurm_cluster.wait_idle(60)
    # a is torn down without a run: no warm interpreter for it
    a = rayup.submit(slurm_cluster, rayup.write_config(slurm_cluster, "share-a", **rayup.NO_TORCH))
    b = rayup.submit(slurm_cluster, rayup.write_config(slurm_cluster, "share-b"))
    try:
        for job in (a, b):
            job.wait_for("Ray cluster ready", timeout=180)
        env_a, env_b = a.env(), b.env()
        assert env_a["RAY_ADDRESS"] != env_b["RAY_ADDRESS"]
        assert Path(env_a["RAY_AUTH_TOKEN_PATH"]).read_text() != Path(env_b["RAY_AUTH_TOKEN_PATH"]).read_text()
        for host in slurm_cluster.hosts:
            tmp = slurm_cluster.host_dir(host) / "tmp"
            assert (tmp / f"raydist-{a.job_id}").is_dir() and (tmp / f"raydist-{b.job_id}").is_dir(), host
        crossed = slurm_cluster.run("master-node", ["ray", "job", "list"],
                                    env={**env_b, "RAY_AUTH_TOKEN_PATH": env_a["RAY_AUTH_TOKEN_PATH"]})
        assert crossed.returncode != 0 and "Authentication failed" in crossed.stdout + crossed.stderr

        slurm_cluster.run("master-node", ["scancel", str(a.job_id)], check=True)
        assert slurm_cluster.wait_job(a.job_id, timeout=120) == "CANCELLED"
        assert _wait_gone(slurm_cluster, a.job_id) == {}
        assert slurm_cluster.job_state(b.job_id) == "RUNNING" and rayup.job_leftovers(slurm_cluster, b.job_id)
        storage = slurm_cluster.shared / "runs"
        r = slurm_cluster.run("master-node", "ray job submit --working-dir . -- python jobs/sync.py "
                              f"--set scaling.num_workers=3 --set train.epochs=1 --set run.storage_path={storage} "
                              "--set run.name=survivor", env=env_b, timeout=400)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        summary = rayup.job_json(r.stdout)
        assert summary["status"] == "completed" and summary["workers"] == 3, summary
    finally:
        slurm_cluster.run("master-node", ["scancel", str(a.job_id), str(b.job_id)])
        for job in (a, b):
            slurm_cluster.wait_job(job.job_id, timeout=120)
    assert _wait_gone(slurm_cluster, b.job_id) == {}
