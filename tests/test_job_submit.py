"""`ray job submit` of jobs/sync.py to a token-protected Ray head (the shared one, tests/support/sharedray.py): accepted with
the token; refused without it (401) or with a wrong one (403)."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.jobutil import REPO
from tests.support.rayhead import VENV_BIN

pytestmark = [pytest.mark.slow, pytest.mark.shared_ray]


@pytest.fixture(scope="module")
def head():
    from tests.support import sharedray

    return sharedray.head()


def _submit(head, env, *job_args, timeout=300):
    proc = subprocess.run(
        [
            str(VENV_BIN / "ray"),
            "job",
            "submit",
            f"--address={head.dashboard_url}",
            f"--working-dir={REPO}",
            "--",
            "python",
            "jobs/sync.py",
            *job_args,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if "Failed to connect to Ray" in proc.stderr:  # once seen in a suite run only: keep the head's side of it
        proc.stderr += "\n" + head.state()
    return proc


def test_submission_with_the_token_trains_on_the_cluster(head, tmp_path):
    proc = _submit(head, head.client_env(), "--set", f"run.storage_path={tmp_path}", "--set", "run.name=submitted")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary_line = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"strategy"')]
    assert summary_line, out[-4000:]
    import json

    summary = json.loads(summary_line[-1])
    assert summary["ray"] not in ("local", "") and summary["test_accuracy"] >= 0.95
    assert (tmp_path / "submitted" / "metrics.jsonl").exists()


def test_submission_without_the_token_or_with_a_wrong_one_is_refused(head, tmp_path):
    wrong = tmp_path / "token"
    wrong.write_text("0" * 32)
    envs = (head.client_env(with_token=False), {**head.client_env(), "RAY_AUTH_TOKEN_PATH": str(wrong)})
    with ThreadPoolExecutor(2) as pool:  # two `ray job submit` start-ups at once: most of each is importing ray
        missing, bad = pool.map(lambda env: _submit(head, env, timeout=60), envs)
    for proc in (missing, bad):
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "submitted successfully" not in out, out[-2000:]
    # Ray's client words an HTTP 401 and 403 from the head exactly so
    # (ray/_private/authentication/http_token_authentication.py)
    out = missing.stdout + missing.stderr
    assert "AuthenticationError: Authentication required: Unauthorized: Missing authentication token" in out, out
    assert "AuthenticationError: Authentication failed: " in bad.stdout + bad.stderr, bad.stderr[-2000:]


def test_dashboard_api_needs_the_token(head):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{head.dashboard_url}/api/jobs/", timeout=10)
    assert err.value.code == 401
    request = urllib.request.Request(
        f"{head.dashboard_url}/api/jobs/",
        headers={"Authorization": f"Bearer {Path(head.token_path).read_text().strip()}"},
    )
    with urllib.request.urlopen(request, timeout=10) as ok:
        assert ok.status == 200


def test_the_python_api_under_ray_job_submit_trains_your_package_on_the_cluster(head, tmp_path):
    """examples/tinygpt uploaded as the working dir: the driver and every worker import the user's package there."""
    proc = subprocess.run(
        [
            str(VENV_BIN / "ray"),
            "job",
            "submit",
            f"--address={head.dashboard_url}",
            f"--working-dir={REPO / 'examples'}",
            "--",
            "python",
            "-m",
            "tinygpt.fit_api",
            "--steps",
            "16",
            "--storage",
            str(tmp_path),
        ],
        cwd=REPO,
        env=head.client_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    done = [ln for ln in proc.stdout.splitlines() if ln.startswith("completed: 16 steps on ")]
    assert done and " on local," not in done[0], out[-4000:]
    assert (tmp_path / "local_sgd-tinygpt" / "summary.json").is_file()


HEAD_ERROR = "[2026-11-29 00:20:14,310 E 7514 7514] (gcs_server) gcs_server.cc:1361: a test's line in the head's log"

DRIVER = r"""
import sys, time
from pathlib import Path
from raydist.driver.session import prepare_ray_environment
prepare_ray_environment()
import ray
ray.init(address=sys.argv[1], log_to_driver=True)  # as raydist's driver joins a cluster (raydist.driver.session)
with open(next(Path(sys.argv[2]).glob("session_latest/logs/gcs_server*.err")), "a") as log:
    log.write(sys.argv[3] + "\n")
@ray.remote
def task():
    print("a line from the job's task", file=sys.stderr)
ray.get(task.remote())
time.sleep(3)  # Ray's log monitor reads the files every few hundred ms and sends what it read to the driver
"""


def test_a_driver_shows_its_jobs_lines_but_not_the_heads_gcs_errors(head):
    """The head's GCS errors (seen: a metrics agent it could not reach on a loaded machine) are the cluster's: they
    stay in its gcs_server.err, and a refusal's one line stays one line. The job's own lines still come through."""
    from tests.support.jobutil import clean_env

    env = {**clean_env(), **head.job_env()}
    proc = subprocess.run(
        [str(VENV_BIN / "python"), "-c", DRIVER, head.gcs_address, head.temp_dir, HEAD_ERROR],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "a line from the job's task" in out, out[-3000:]
    assert "a test's line in the head's log" not in out, out[-3000:]
