"""Scripts written the way users write them give torchrun's result under `raydist launch`, and print the
environment their framework detected: here the short version, plain DDP reading srun's variables and an FSDP2 script
with torch.distributed.checkpoint that snapshots at the time-limit signal and resumes. The whole matrix (the
Lightning and Hugging Face Trainer scripts too, under srun and in batch mode as well) is benchmarks/conformance.py,
its outcome stored in docs/data/conformance.json; Lightning Fabric's launcher detection is tests/test_launch.py's.
On the emulated SLURM hosts, srun against raydist launch: tests/test_slurm_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conformance import harness
from tests.support.jobutil import clean_env

pytestmark = [pytest.mark.slow, pytest.mark.shared_ray]
BIN = Path(sys.executable).parent


def env(work: Path) -> dict[str, str]:
    return clean_env(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", TMPDIR=str(work))


@pytest.fixture(scope="module")
def work() -> Path:
    d = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))
    yield d
    import shutil

    shutil.rmtree(d, ignore_errors=True)


def under_torchrun(name: str, work: Path) -> dict:
    where = work / f"torchrun-{name}"
    where.mkdir()
    return harness.torchrun(name, where, 2, env(where))


def under_launch(name: str, where: Path, *options: str, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    where.mkdir(exist_ok=True)
    return subprocess.Popen(
        harness.launch_argv(name, where, 2, name, *options) + list(extra),
        cwd=where,
        env=env(where),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    return harness.finished(proc.returncode, out + err)


@pytest.mark.long
def test_a_users_script_gives_torchruns_result_under_raydist_launch(work):
    """Long; in the suite, test_launch's script reading RANK trains to torchrun's checksum, and this script against
    srun on three emulated hosts is test_slurm_cluster's."""
    expected = under_torchrun("ddp_slurm", work)
    got = finished(under_launch("ddp_slurm", work / "launch-ddp_slurm"))
    assert harness.same(got, expected), (got, expected)
    assert got["env"] == {"read": "SLURM_PROCID"}, got  # raydist sets srun's variables too: the script reads those


def test_an_fsdp2_script_stopped_by_the_time_limit_signal_resumes_to_torchruns_result(work):
    expected = under_torchrun("fsdp2_dcp", work)
    where = work / "launch-fsdp2_dcp"
    proc = under_launch("fsdp2_dcp", where, extra=("0.15",))  # 40 steps of 0.15 s
    log = where / "runs" / "fsdp2_dcp" / "logs" / "rank0.log"
    deadline = time.monotonic() + 120
    while not (log.exists() and "step 10 " in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)  # as SLURM's time-limit warning becomes SIGTERM to every rank
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "SIGTERM: snapshot at step" in out, (out + err)[-3000:]
    got = finished(under_launch("fsdp2_dcp", where))  # the same command again, as a requeued job runs it
    assert 10 <= got["resumed_from"] < 40 and harness.same(got, expected), (got, expected)
    assert got["env"] == {"sharded": "DTensor"}
