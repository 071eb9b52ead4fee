"""`raydist launch` on real SLURM daemons (three emulated hosts whose interfaces are named differently): the
hand-written sbatch script (examples/srun_before.sbatch) and SLURM batch mode running the same, unmodified script
with `raydist launch`, warned at the time limit in between, end with the same parameter checksum.

The warning is sent as SLURM sends it (`scancel --batch --signal=USR1`); after the requeue the job is released at
once (tests/test_slurm_resilience.py says why SLURM holds it back).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.support.cluster import rayup
from tests.support.cluster.resilience import release_after_requeue, wait_text

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ARGS = ["--epochs", "3", "--batch-size", "32"]


def _wait_for(path: Path, job: rayup.RayUpJob, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline and job.cluster.job_state(job.job_id) in ("PENDING", "RUNNING"), job.text()[
            -4000:
        ]
        time.sleep(0.2)


def _status_ranks(cluster, job: rayup.RayUpJob, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        r = cluster.run("node01", ["raydist", "status", "--json"], env=job.env())
        ranks = json.loads(r.stdout).get("launched", []) if r.stdout.startswith("{") else []
        if len([x for x in ranks if x["run"] == "batch-launch" and "step" in x]) == 3:
            return [x for x in ranks if x["run"] == "batch-launch"]
        assert time.monotonic() < deadline, (r.stdout[-3000:], r.stderr[-3000:])
        time.sleep(1)


@pytest.mark.long
def test_the_srun_script_and_raydist_launch_in_batch_mode_warned_and_requeued_end_alike(slurm_cluster):
    shared = slurm_cluster.shared / "launch"
    shared.mkdir(exist_ok=True)
    # Before: the hand-written sbatch script, as users run it today.
    slurm_cluster.wait_idle(60)
    before = shared / "before.json"
    out = slurm_cluster.shared / "before-%j.out"
    job_id = slurm_cluster.sbatch(
        f"--output={out}",
        "examples/srun_before.sbatch",
        *ARGS,
        "--snapshot",
        str(shared / "before.pt"),
        "--out",
        str(before),
        env=slurm_cluster.env(),
    )
    state = slurm_cluster.wait_job(job_id, timeout=240)
    text = Path(str(out).replace("%j", str(job_id))).read_text()
    assert state == "COMPLETED", f"{state}\n{text[-3000:]}"
    expected = json.loads(before.read_text())
    assert expected["world_size"] == 3

    # After: batch mode, the time-limit warning once the script has written its first snapshot.
    slurm_cluster.wait_idle(60)
    snap, after, storage = shared / "after.pt", shared / "after.json", slurm_cluster.shared / "runs"
    command = (
        "raydist",
        "launch",
        "--workers",
        "3",
        "--name",
        "batch-launch",
        "--storage",
        str(storage),
        "--",
        "python",
        "examples/ddp_train.py",
        *ARGS,
        "--step-sleep",
        "0.1",
        "--snapshot",
        str(snap),
        "--out",
        str(after),
    )
    job = rayup.submit(slurm_cluster, rayup.write_config(slurm_cluster, "batch-launch"), command=command)
    _wait_for(snap, job)
    ranks = _status_ranks(slurm_cluster, job)  # `raydist status` lists the script's ranks on their nodes
    assert {(r["rank"], r["node"]) for r in ranks} == {(0, "master-node"), (1, "node01"), (2, "node02")}
    assert all(r["state"] == "alive" and r["restarts"] == 0 and r["rss_bytes"] > 0 for r in ranks), ranks
    slurm_cluster.run("master-node", ["scancel", "--batch", "--signal=USR1", str(job.job_id)], check=True)
    stopped = wait_text(job, r"SIGTERM: snapshot at step (\d+), exiting", timeout=60)
    wait_text(job, r"requeueing after the time limit \(1 of at most 3\)", timeout=90)
    logs = storage / "batch-launch" / "logs"
    for rank in range(3):  # every rank got the signal
        assert f"rank {rank}: SIGTERM received" in (logs / f"rank{rank}.log").read_text()
    release_after_requeue(job)
    state = slurm_cluster.wait_job(job.job_id, timeout=300)
    assert state == "COMPLETED", f"{state}\n{job.text()[-3000:]}"

    result = json.loads(after.read_text())
    assert result["resumed_from"] == int(stopped.group(1)) > 0
    assert result["steps"] == expected["steps"] and result["world_size"] == 3
    assert result["checksum"] == expected["checksum"], (result, expected)  # no step lost, repeated or changed
    summary = json.loads((storage / "batch-launch" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["ray"] != "local"
    assert [(r["rank"], r["node"], r["iface"]) for r in summary["ranks"]] == [
        (0, "master-node", "ens1f1"),
        (1, "node01", "ens1f1"),
        (2, "node02", "ens1f0np0"),
    ]
    text = job.text()
    assert "command exited 0 (run completed); command completed" in text
    # Both starts' ranks, before and after the requeue, were fresh interpreters, as srun starts them (the default).
    assert len(re.findall(r"3 ranks \(", text)) == 2 and "forked with torch imported" not in text, text[-4000:]
    assert re.search(r"\[rank 0 master-node\] resumed from \S+ at step \d+", text)
